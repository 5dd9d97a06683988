// Package engine runs txhook's transactions. Every transactional path of the
// library goes through Run: Process on a pool, a connection or any Beginner,
// ProcessTx under a savepoint of the caller's transaction, lease mode's phase
// two, the inbox's apply, Replay, Run and RunTx; and every statement the library
// sends outside a transaction goes through Autocommit.
//
// A run is a transaction (or a savepoint) with an optional first step and a
// body. The first step is one statement whose answer decides whether the
// body's work may commit: the dedupe step, lease mode's done mark, the
// replay's row lock. The body is the application's handler. Two
// optimisations live here, for every path alike:
//   - BEGIN travels with the first statement (a savepoint's SAVEPOINT is
//     a round trip before it), and the first step with BEGIN or, with
//     Spec.WithFirstStatement, with the body's first statement;
//   - statements the body defers (Deferred) travel with its next statement
//     or with the end of the transaction: the transaction they were
//     deferred on, not a savepoint of it, whose statements go past them.
//
// The engine knows nothing of events, keys or results: the caller's first
// step and body record what they learn, and the caller turns Run's error
// into its own answer.
//
// # Reading the engine
//
// Run (this file) tries a run's attempts; each attempt is a Tx (tx.go), the
// pgx.Tx the body is given, which sends its statements lazily, in batches
// (batch.go). How a Tx begins and ends is its strategy (strategy.go), one
// type per Target: connTx on a pool or a connection (conn.go), beginnerTx
// on any other Beginner (beginner.go), savepointTx in the caller's
// transaction (savepoint.go), which also routes a savepoint's statements
// past what the transaction around it deferred. The first step rides in the
// first batch (first.go); deferred statements wait in the Tx's queue
// (deferred.go). What the errors mean,
// and which are retried, is errors.go and classify.go; statements outside
// any transaction are autocommit.go.
package engine

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Beginner starts transactions: a *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn or
// a wrapper around one.
type Beginner interface {
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
}

// Querier runs statements: sqlc's DBTX method set.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Target is where a run's transaction lives: a new transaction on a
// database, or a savepoint in a transaction the caller owns.
type Target struct {
	db     Beginner
	parent pgx.Tx
}

// Begin targets a new transaction on db.
func Begin(db Beginner) Target { return Target{db: db} }

// Savepoint targets a savepoint in tx, the caller's transaction. A run there
// is never retried and never commits tx.
func Savepoint(tx pgx.Tx) Target { return Target{parent: tx} }

// Nested reports whether t is a savepoint in the caller's transaction.
func (t Target) Nested() bool { return t.parent != nil }

// Statement runs fn, which sends one statement through q, at t but outside
// a run: on a database outside any transaction (Autocommit, with o), in a
// savepoint's target in the caller's transaction itself.
func Statement(ctx context.Context, t Target, o Options, fn func(ctx context.Context, q Querier) error) error {
	if t.Nested() {
		return Exec(ctx, t.parent, fn)
	}
	return Autocommit(ctx, t.db, o, fn)
}

// Options configures runs. Callers apply their defaults; zero values are
// used as they are.
type Options struct {
	// Tx is the isolation level and access mode of a new transaction.
	Tx pgx.TxOptions
	// MaxAttempts bounds how many times a run on a new transaction is tried
	// (see Run).
	MaxAttempts int
	// BaseBackoff and MaxBackoff shape the wait between attempts.
	BaseBackoff, MaxBackoff time.Duration
	// FinishTimeout bounds COMMIT and ROLLBACK, which run under a context
	// the caller's cancellation does not reach.
	FinishTimeout time.Duration
}

// Spec is the work of one run.
type Spec struct {
	// First is the transaction's first step, or nil. It must send exactly
	// one statement through q (Exec, or QueryRow then Scan) and may then
	// return an error to stop the run: the body's work is rolled back and
	// Run returns that error (ErrRollback for a stop that is not a
	// failure). It runs once per attempt, before Body's statements.
	First func(ctx context.Context, q Querier) error
	// WithFirstStatement sends First's statement together with Body's first
	// statement, in one round trip, instead of with BEGIN before Body runs.
	// Body then starts before First has answered; when First stops the
	// run, Body's statements return ErrNotNew, and what Body returns is
	// ignored. Body's statements sent with First's run after it, under
	// whatever settings it left (txhook's dedupe step bounds its own lock
	// wait and restores the session's lock_timeout for a new key; for a key
	// that is not new it fails, so that the statements sent with it never
	// run: FirstAborts).
	WithFirstStatement bool
	// FirstAborts declares that First's statement itself fails, aborting
	// the transaction, whenever First stops the run (txhook's dedupe step
	// raises an error for a recorded key), so that the server skips what
	// follows it in its round trip, COMMIT included. Under
	// WithFirstStatement, a Body that sends nothing but deferred statements
	// then costs one round trip on a pool or a connection: BEGIN, First's
	// statement, the deferred statements and COMMIT travel together (see
	// connTx.commitWithFirst). A First that stops the run after its
	// statement succeeded breaks the promise: the run fails, and what
	// travelled with its statement may have committed.
	FirstAborts bool
	// Body is the application's work, run in the transaction. Its error
	// rolls back the run and is returned by Run.
	Body func(ctx context.Context, tx pgx.Tx) error
	// BeforeCommit, if set, runs after Body succeeded, immediately before
	// COMMIT (or RELEASE SAVEPOINT) is sent.
	BeforeCommit func()
}

// Run runs s at t. On a new transaction it commits when s.Body returns nil
// and retries, with backoff and up to o.MaxAttempts attempts in all, an
// attempt that failed with a serialization failure or deadlock, or whose
// BEGIN failed before anything was applied. A savepoint run is tried once
// and released, never committed; when its savepoint cannot be rolled back
// after a failure, the error says that the caller's transaction is not
// usable (ErrTxUnusable).
//
// A body that ends the transaction itself, with ROLLBACK or COMMIT sent as
// SQL, fails the run: the connection reports its transaction status with
// every answer, and once it is outside a transaction the body's later
// statements are refused (each would commit on its own) and nothing is
// committed as the run's. Under a savepoint the transaction that ended is
// the caller's, and the error matches ErrTxUnusable.
//
// ctx bounds BEGIN, the first step, the body and the body's deferred
// statements: once ctx has ended, nothing the body deferred is sent and the
// run fails. COMMIT and ROLLBACK are bounded by o.FinishTimeout instead, and
// so are the deferred statements that travel with COMMIT on a pool or
// connection, and BEGIN and the first step when they travel with it too
// (Spec.FirstAborts; the connection is still acquired under ctx).
//
// The error is nil (committed), ErrRollback or the first step's own error
// (rolled back, as the first step asked), a *CommitUnknownError, an
// *UnavailableError, or the failure of the attempt (rolled back).
func Run(ctx context.Context, t Target, o Options, s Spec) error {
	attempts := o.MaxAttempts
	if t.Nested() {
		attempts = 1
	}
	for attempt := 1; ; attempt++ {
		tx := newTx(t, o.Tx, firstStep{
			fn:            s.First,
			withStatement: s.WithFirstStatement && s.First != nil,
			aborts:        s.FirstAborts,
		})
		err := runOnce(ctx, tx, o.FinishTimeout, s)
		if err == nil {
			return nil
		}
		if attempt >= attempts || !retryable(err) {
			return classify(err, tx)
		}
		if werr := sleep(ctx, backoff(o.BaseBackoff, o.MaxBackoff, attempt)); werr != nil {
			return errors.Join(err, werr)
		}
	}
}

// runOnce is one attempt of Run.
func runOnce(ctx context.Context, tx *Tx, finish time.Duration, s Spec) (err error) {
	defer func() {
		if p := recover(); p != nil {
			_ = tx.abort(ctx, finish)
			panic(p)
		}
	}()
	if tx.first.fn != nil && !tx.first.withStatement {
		tx.begin(ctx, nil, 0) // BEGIN and the first step: one round trip
	}
	var berr error
	if tx.err() == nil {
		berr = s.Body(ctx, tx)
		if berr != nil {
			tx.queue = nil // rolled back: nothing deferred needs to run
		}
		if tx.first.fn != nil && (berr != nil || !tx.firstWithCommit(ctx)) {
			// Under WithFirstStatement, a body that sent nothing: the
			// first step's answer still decides. It travels with COMMIT
			// instead when it can (Spec.FirstAborts).
			tx.begin(ctx, nil, 0)
		}
	}
	switch {
	case tx.err() != nil:
		return tx.abortWith(ctx, finish, tx.cause())
	case berr != nil:
		return tx.abortWith(ctx, finish, berr)
	}
	if err := ctx.Err(); err != nil && len(tx.queue) > 0 {
		// The body's deferred statements are part of its work: not sent
		// once its context has ended.
		return tx.abortWith(ctx, finish, &DeferredError{Err: err})
	}
	if s.BeforeCommit != nil {
		s.BeforeCommit()
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finish)
	defer cancel()
	return tx.s.commit(ctx, cctx)
}

func backoff(base, limit time.Duration, attempt int) time.Duration {
	d := base << (attempt - 1)
	if d <= 0 || d > limit {
		d = limit
	}
	if d <= 0 {
		return 0
	}
	return rand.N(d) + 1
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
