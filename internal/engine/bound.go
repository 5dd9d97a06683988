package engine

import (
	"errors"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
)

// The first step's lock_timeout bound. The first step's statement must not
// wait long on a lock a concurrent run holds (the dedupe step's insert
// waits for the commit of another delivery of its key), and under
// Spec.WithFirstStatement neither must the body's statements sent with it,
// which run before its answer is known (for a key that is not new, on a
// lock the first delivery holds): they are sent under Spec.LockTimeout,
// set before them in the first batch and restored after them.

const (
	// boundSQL saves the session's lock_timeout, sets the first step's
	// bound, for its statement and the body's sent with it, and saves the
	// bound as the server spells it (2000ms is 2s).
	boundSQL = "-- name: LockTimeoutBound\nselect set_config('txhook.lock_timeout', current_setting('lock_timeout'), true), set_config('txhook.lock_timeout_bound', set_config('lock_timeout', $1, true), true)"
	// unboundSQL restores the saved lock_timeout for the body's later
	// statements, when the bound is still in force: a body statement sent
	// with the first step that set lock_timeout itself (SET LOCAL
	// lock_timeout) keeps its setting for the rest of the transaction.
	unboundSQL = "-- name: LockTimeoutRestored\nselect case when current_setting('lock_timeout') = current_setting('txhook.lock_timeout_bound') then set_config('lock_timeout', current_setting('txhook.lock_timeout'), true) end"
)

// boundCut reports whether err, the error of a statement sent under the
// first step's bound, may be the bound cutting its lock wait short: a
// lock_timeout that ran out (raised where the server checks for timeouts;
// a NOWAIT's refusal fails at once, whatever the bound, and is the
// statement's own). Without the bound, such a statement could have waited
// longer. txhook's own functions that set their own lock_timeout answer
// with SQLSTATEs of their own (the body dedupe's P0T02), not 55P03.
func boundCut(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && pgErr.Code == pgerrcode.LockNotAvailable && pgErr.Routine == "ProcessInterrupts"
}
