package engine

import (
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"
)

// What a failed attempt means: whether it may run again (retryable), what
// a failed COMMIT says of the transaction (commitError), and whether the
// database could be used at all (Unreachable, classify).

// retryable reports whether a failed attempt can safely run again: the
// server rolled it back for a serialization failure or a deadlock, or BEGIN
// failed before anything was applied.
func retryable(err error) bool {
	if _, ok := errors.AsType[*CommitUnknownError](err); ok {
		return false
	}
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok &&
		(pgErr.Code == pgerrcode.SerializationFailure || pgErr.Code == pgerrcode.DeadlockDetected) {
		return true
	}
	if be, ok := errors.AsType[*beginError](err); ok {
		return pgconn.SafeToRetry(be.err)
	}
	return false
}

// commitError classifies the error of a transaction's COMMIT: rolled back
// by the server, or of unknown outcome. A savepoint's RELEASE is not
// classified: it commits nothing.
func commitError(err error) error {
	if err == nil {
		return nil
	}
	if cu, ok := errors.AsType[*CommitUnknownError](err); ok {
		return cu // known unknown: the connection failed during the commit's batch
	}
	var pgErr *pgconn.PgError
	var rb *rolledBackError
	var de *DeferredError
	if errors.Is(err, pgx.ErrTxCommitRollback) || errors.As(err, &rb) || errors.As(err, &de) ||
		(errors.As(err, &pgErr) && pgErr.Severity == "ERROR") {
		// The server answered COMMIT with an error (a deferred constraint, a
		// serialization failure), or a statement sent with it failed: the
		// transaction rolled back.
		return fmt.Errorf("commit: %w", err)
	}
	// The connection failed, or the server ended the session (FATAL): the
	// COMMIT may or may not have taken effect.
	return &CommitUnknownError{Err: err}
}

// classify marks the final error of a run: an attempt that failed because
// the database could not be used is an *UnavailableError.
func classify(err error, tx *Tx) error {
	if _, ok := errors.AsType[*CommitUnknownError](err); ok {
		return err
	}
	if _, ok := errors.AsType[*UnavailableError](err); ok {
		return err
	}
	if _, ok := errors.AsType[*beginError](err); ok && Unreachable(err) {
		return &UnavailableError{Err: err}
	}
	if tx.connClosed() && Unreachable(err) {
		return &UnavailableError{Err: err}
	}
	return err
}

// Unreachable reports whether err says the database cannot be used now: a
// closed pool, a failed connection attempt or a lost connection, a server
// shutting down or refusing connections, or a database that does not exist
// (dropped under a running application). It is the one test of that: the
// engine's runs and statements classify their errors with it, and so does
// an HTTP endpoint for what reaches it.
func Unreachable(err error) bool {
	if errors.Is(err, puddle.ErrClosedPool) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) {
		return true
	}
	if _, ok := errors.AsType[*pgconn.ConnectError](err); ok {
		return true
	}
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		switch pgErr.Code {
		case pgerrcode.AdminShutdown, pgerrcode.CrashShutdown, pgerrcode.CannotConnectNow,
			pgerrcode.TooManyConnections,
			pgerrcode.InvalidCatalogName: // the database does not exist
			return true
		}
		return pgerrcode.IsConnectionException(pgErr.Code) || pgErr.Severity == "FATAL" || pgErr.Severity == "PANIC"
	}
	if _, ok := errors.AsType[net.Error](err); ok {
		return true
	}
	return pgconn.SafeToRetry(err)
}
