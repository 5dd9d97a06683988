package engine

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// The errors of runs and of the transactions they hand out. The root
// package gives the exported ones to its users under the same names.
var (
	// ErrRollback is returned by a first step or a body that wants the
	// transaction rolled back without a failure; Run returns it as is.
	ErrRollback = errors.New("txhook: rollback requested")
	// ErrNotNew is what Body's statements return under
	// Spec.WithFirstStatement once the first step has stopped the run with
	// ErrRollback.
	ErrNotNew = errors.New("txhook: event key already committed or in flight; the transaction rolls back")
	// ErrCommitUnknown is matched (errors.Is) by a *CommitUnknownError.
	ErrCommitUnknown = errors.New("txhook: commit outcome unknown")
	// ErrUnavailable is matched (errors.Is) by an *UnavailableError.
	ErrUnavailable = errors.New("txhook: database unavailable")
	// ErrTxUnusable is matched (errors.Is) by the error of a run under a
	// savepoint (Savepoint) that left the caller's transaction in a state
	// nobody knows: the savepoint could not be rolled back after the run
	// failed, or a statement of the run ended the caller's transaction
	// (ROLLBACK or COMMIT sent as SQL). The caller must roll its
	// transaction back and must not acknowledge what it carried.
	ErrTxUnusable = errors.New("txhook: the caller's transaction is not usable and must be rolled back")
)

var (
	// errTxDone is returned by a transaction used after it ended.
	errTxDone = fmt.Errorf("txhook: the transaction has ended: %w", pgx.ErrTxClosed)
	// errRunOwned is returned when a run's body commits or rolls back the
	// transaction it was given.
	errRunOwned = errors.New("txhook: the transaction is committed or rolled back by txhook, not by the handler")
	// errTxEnded is returned by the statements of a run whose transaction
	// is no longer open on its connection: a statement of the run ended it
	// (see Tx.ended). The run fails; what the statement committed, if it
	// was COMMIT, stays committed.
	errTxEnded = errors.New("txhook: a statement of the run ended its transaction (ROLLBACK or COMMIT sent as SQL)")
	// errCallerTxEnded is errTxEnded under a savepoint: the transaction
	// that ended is the caller's.
	errCallerTxEnded = fmt.Errorf("%w: %w", ErrTxUnusable, errTxEnded)
)

// CommitUnknownError is returned when the connection failed while COMMIT
// was in flight: the transaction may or may not have committed. It is never
// retried. Callers answering a sender must not acknowledge the event: the
// sender's retry then finds either the committed key (a duplicate) or
// nothing (and processes the event), so nothing is lost.
type CommitUnknownError struct {
	// Err is the connection's error.
	Err error
}

// Error describes the unknown outcome and its cause.
func (e *CommitUnknownError) Error() string {
	return "txhook: commit outcome unknown: " + e.Err.Error()
}

// Unwrap returns the connection's error.
func (e *CommitUnknownError) Unwrap() error { return e.Err }

// Is makes every CommitUnknownError match ErrCommitUnknown.
func (e *CommitUnknownError) Is(target error) bool { return target == ErrCommitUnknown }

// UnavailableError is returned when the database could not be used: it
// could not be reached, it does not exist, the pool is closed, or the
// session ended under the run (see Unreachable). Nothing of the run
// committed. Callers answering a sender ask it to retry later (an HTTP
// endpoint answers 503 with Retry-After). A pooled connection that the
// server had ended before the run sent anything is replaced once, at no
// cost to the caller, before this error is returned.
type UnavailableError struct {
	// Err is the cause.
	Err error
}

// Error describes the failure and its cause.
func (e *UnavailableError) Error() string { return "txhook: database unavailable: " + e.Err.Error() }

// Unwrap returns the cause.
func (e *UnavailableError) Unwrap() error { return e.Err }

// Is makes every UnavailableError match ErrUnavailable.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// DeferredError is the error of a deferred statement (or of the batch that
// carried it). The run fails whatever its body returned.
type DeferredError struct{ Err error }

func (e *DeferredError) Error() string { return "deferred statement not applied: " + e.Err.Error() }
func (e *DeferredError) Unwrap() error { return e.Err }

// beginError marks a failure to begin the transaction: nothing was applied.
type beginError struct{ err error }

func (e *beginError) Error() string { return "begin transaction: " + e.err.Error() }
func (e *beginError) Unwrap() error { return e.err }

// rolledBackError is a commit error after which the transaction is known to
// have rolled back.
type rolledBackError struct{ err error }

func (e *rolledBackError) Error() string { return e.err.Error() }
func (e *rolledBackError) Unwrap() error { return e.err }

// unusableError reports that a savepoint could not be rolled back after
// its run failed: what the run did may still be in the caller's
// transaction, which is not usable and must be rolled back. It matches
// ErrTxUnusable and unwraps to the rollback's error: the run's own outcome
// (a duplicate, a permanent failure) does not hold.
type unusableError struct{ cause, err error }

func (e *unusableError) Error() string {
	return fmt.Sprintf("rollback to savepoint failed, the enclosing transaction is not usable and must be rolled back: %v (the savepoint's work failed: %v)", e.err, e.cause)
}

func (e *unusableError) Unwrap() error { return e.err }

// Is makes every unusableError match ErrTxUnusable.
func (e *unusableError) Is(target error) bool { return target == ErrTxUnusable }
