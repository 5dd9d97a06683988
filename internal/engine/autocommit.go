package engine

import (
	"context"
	"errors"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Autocommit runs fn, which sends one statement through q, outside any
// transaction: the statement commits on its own as it runs, in one round
// trip (lease mode's claim, renewal and release). On a database that runs
// statements (a pool, a connection, a wrapper with Exec, Query and
// QueryRow) it is Exec; on a Beginner that only begins transactions, fn
// runs in a transaction of Run's, with o.
func Autocommit(ctx context.Context, db Beginner, o Options, fn func(ctx context.Context, q Querier) error) error {
	if q, ok := db.(Querier); ok {
		return Exec(ctx, q, fn)
	}
	return Run(ctx, Begin(db), o, Spec{Body: func(ctx context.Context, tx pgx.Tx) error { return fn(ctx, tx) }})
}

// Exec runs fn, which sends one statement through q, on db, outside any
// transaction (see Autocommit; the duplicate filter's read calls it
// directly). On a pool the statement runs on a connection of its own, and
// a connection the server had ended before the statement ran
// (pg_terminate_backend, a restart) is replaced once and the statement sent
// again, as Run replaces it for a first batch. A database that cannot be
// used gives an *UnavailableError; any other error is fn's. fn does not
// escape: a caller's closure stays on its stack.
func Exec(ctx context.Context, db Querier, fn func(ctx context.Context, q Querier) error) error {
	var err error
	if pool, ok := db.(*pgxpool.Pool); ok {
		err = onPool(ctx, pool, fn)
	} else {
		err = fn(ctx, db)
	}
	if err != nil && Unreachable(err) {
		return &UnavailableError{Err: err}
	}
	return err
}

// onPool runs fn on a connection acquired from pool, and once more on
// another when the first one's session had ended before fn's statement ran.
func onPool(ctx context.Context, pool *pgxpool.Pool, fn func(ctx context.Context, q Querier) error) error {
	for try := 0; ; try++ {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		err = fn(ctx, c.Conn())
		again := try == 0 && err != nil && c.Conn().IsClosed() && notRun(err)
		c.Release()
		if !again {
			return err
		}
	}
}

// notRun reports whether err, the error of a statement on a connection now
// closed, says that the statement did not run: nothing of it was sent, or
// the server had ended the session (pg_terminate_backend, a shutdown). The
// server ends a session only between statements or by aborting the one
// running, never between a statement's commit and its answer. A connection
// lost without a word (a crash, a cut network) may have committed the
// statement: that error is returned.
func notRun(err error) bool {
	if pgconn.SafeToRetry(err) {
		return true
	}
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && pgErr.Code == pgerrcode.AdminShutdown
}
