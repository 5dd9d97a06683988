package txhook

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txhook/txhook/db"
)

// Beginner starts transactions. *pgxpool.Pool, *pgxpool.Conn and *pgx.Conn
// satisfy it, as do wrappers around them (tracing, tests). A pgx.Tx does
// not: to join a caller's transaction, use Processor.ProcessTx or
// RunNestedTx.
type Beginner interface {
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
}

// TxFunc is the work run inside a transaction. It must use tx (not the pool)
// for every statement that should commit or roll back with the transaction.
type TxFunc func(ctx context.Context, tx pgx.Tx) error

// TxOptions configures RunTx. The zero value (or nil) runs READ COMMITTED,
// READ WRITE, with up to 3 attempts.
type TxOptions struct {
	// IsoLevel is the isolation level. Defaults to the server's default
	// (READ COMMITTED unless configured otherwise).
	IsoLevel pgx.TxIsoLevel
	// AccessMode is READ WRITE or READ ONLY. Defaults to the server's default.
	AccessMode pgx.TxAccessMode
	// MaxAttempts bounds how many times fn runs when the transaction fails
	// with a serialization failure (40001) or a deadlock (40P01), or when
	// BEGIN fails before anything reached the server. Defaults to 3; 1
	// disables retries.
	MaxAttempts int
	// BaseBackoff is the wait before the second attempt; each later wait
	// doubles it, with full jitter. Defaults to 10ms.
	BaseBackoff time.Duration
	// MaxBackoff caps a single wait. Defaults to 1s.
	MaxBackoff time.Duration
	// FinishTimeout bounds COMMIT and ROLLBACK, which run under
	// context.WithoutCancel: a cancelled request context neither leaves a
	// transaction open on a pooled connection nor turns a finished piece of
	// work into an unknown outcome. Defaults to 10s.
	FinishTimeout time.Duration
}

func (o *TxOptions) withDefaults() TxOptions {
	var v TxOptions
	if o != nil {
		v = *o
	}
	if v.MaxAttempts <= 0 {
		v.MaxAttempts = 3
	}
	if v.BaseBackoff <= 0 {
		v.BaseBackoff = 10 * time.Millisecond
	}
	if v.MaxBackoff <= 0 {
		v.MaxBackoff = time.Second
	}
	if v.FinishTimeout <= 0 {
		v.FinishTimeout = 10 * time.Second
	}
	return v
}

// pgx returns the options pgx begins transactions with.
func (o TxOptions) pgx() pgx.TxOptions {
	return pgx.TxOptions{IsoLevel: o.IsoLevel, AccessMode: o.AccessMode}
}

// errRollback is returned by a TxFunc that wants its transaction rolled back
// without reporting an error (a duplicate needs no commit).
var errRollback = errors.New("txhook: rollback requested")

// RunTx runs fn in a new transaction on db and commits it when fn returns nil.
//
// When fn returns an error or panics, the transaction is rolled back (and the
// panic re-raised). A serialization failure or deadlock, from fn or from
// COMMIT, rolls back and runs fn again in a new transaction, up to
// opts.MaxAttempts times with exponential backoff; fn must therefore be safe
// to run again (its effects on the database are rolled back between
// attempts). A COMMIT whose outcome cannot be known, because the connection
// failed while it was in flight, is reported as ErrCommitUnknown and never
// retried: the work may have committed.
//
// ctx bounds BEGIN and fn; COMMIT and ROLLBACK are bounded by
// opts.FinishTimeout instead.
func RunTx(ctx context.Context, db Beginner, opts *TxOptions, fn TxFunc) error {
	return runTx(ctx, db, opts.withDefaults(), nil, fn, nil)
}

// firstFunc is a transaction's first step. Its first statement shares a round
// trip with BEGIN when the database allows (see beginWith); q runs statements
// in the transaction.
type firstFunc func(ctx context.Context, q db.DBTX) error

// runTx is RunTx with options already defaulted, an optional first step that
// runs before fn (its error ends the attempt like fn's), and a hook that runs
// after fn succeeds, immediately before COMMIT.
func runTx(ctx context.Context, d Beginner, o TxOptions, first firstFunc, fn TxFunc, beforeCommit func()) error {
	txOpts := o.pgx()
	return runTxWith(ctx, o, func(ctx context.Context) (pgx.Tx, error) {
		return beginWith(ctx, d, txOpts, first)
	}, fn, beforeCommit)
}

// beginFunc begins one attempt's transaction. It returns the transaction
// whenever one was begun, also with an error (the caller rolls it back).
type beginFunc func(ctx context.Context) (pgx.Tx, error)

// runTxWith is runTx with the transaction begun by begin.
func runTxWith(ctx context.Context, o TxOptions, begin beginFunc, fn TxFunc, beforeCommit func()) error {
	for attempt := 1; ; attempt++ {
		err := runTxOnce(ctx, begin, o.FinishTimeout, fn, beforeCommit)
		if err == nil || attempt >= o.MaxAttempts || !isRetryable(err) {
			return err
		}
		if werr := sleepCtx(ctx, backoff(o.BaseBackoff, o.MaxBackoff, attempt)); werr != nil {
			return errors.Join(err, werr)
		}
	}
}

func runTxOnce(ctx context.Context, begin beginFunc, finish time.Duration, fn TxFunc, beforeCommit func()) (err error) {
	tx, err := begin(ctx)
	if tx == nil {
		return err
	}
	defer func() {
		if p := recover(); p != nil {
			rollback(ctx, tx, finish)
			panic(p)
		}
	}()
	if err != nil {
		rollback(ctx, tx, finish)
		return err
	}
	if err := fn(ctx, tx); err != nil {
		rollback(ctx, tx, finish)
		return err
	}
	if beforeCommit != nil {
		beforeCommit()
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finish)
	defer cancel()
	if err := tx.Commit(cctx); err != nil {
		return commitError(err)
	}
	return nil
}

// RunNestedTx runs fn inside tx, the caller's transaction, under a savepoint:
// when fn returns an error or panics, only fn's work is rolled back and tx
// stays usable; when fn returns nil the savepoint is released and fn's work
// commits or rolls back with the caller's transaction. It never retries and
// never commits tx.
func RunNestedTx(ctx context.Context, tx pgx.Tx, fn TxFunc) (err error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin savepoint: %w", err)
	}
	defer func() {
		if p := recover(); p != nil {
			rollback(ctx, sp, defaultFinishTimeout)
			panic(p)
		}
	}()
	if err := fn(ctx, sp); err != nil {
		rollback(ctx, sp, defaultFinishTimeout)
		return err
	}
	if err := sp.Commit(ctx); err != nil {
		return fmt.Errorf("release savepoint: %w", err)
	}
	return nil
}

const defaultFinishTimeout = 10 * time.Second

// rollback rolls tx back under a context that the caller's cancellation does
// not reach, so the connection goes back to the pool clean.
func rollback(ctx context.Context, tx pgx.Tx, timeout time.Duration) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	// A failed rollback leaves nothing to do: pgx closes a connection whose
	// rollback failed, and the server rolls back what that connection had open.
	_ = tx.Rollback(rctx)
}

// beginError marks a failure to start a transaction.
type beginError struct{ err error }

func (e *beginError) Error() string { return "begin transaction: " + e.err.Error() }
func (e *beginError) Unwrap() error { return e.err }

func commitError(err error) error {
	var pgErr *pgconn.PgError
	var rb *rolledBackError
	if errors.Is(err, pgx.ErrTxCommitRollback) || errors.As(err, &rb) ||
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

// isRetryable reports whether a failed attempt can safely run again: the
// server rolled it back for a serialization failure or a deadlock, or BEGIN
// failed before anything was sent.
func isRetryable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "40001" || pgErr.Code == "40P01"
	}
	var be *beginError
	if errors.As(err, &be) {
		return pgconn.SafeToRetry(be.err)
	}
	return false
}

func backoff(base, limit time.Duration, attempt int) time.Duration {
	d := base << (attempt - 1)
	if d <= 0 || d > limit {
		d = limit
	}
	return rand.N(d) + 1
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
