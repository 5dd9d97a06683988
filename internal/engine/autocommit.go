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
// trip (lease mode's claim, renewal and release, the duplicate filter's
// read). On a pool it runs on a connection of its own, and a connection the
// server had ended before the statement ran (pg_terminate_backend, a
// restart) is replaced once and the statement sent again, as Run replaces
// it for a first batch; on a connection, or on a Beginner that also runs
// statements, it runs there; on a Beginner that only begins transactions,
// in a transaction of Run's, with o.
//
// A database that cannot be used gives an *UnavailableError; any other
// error is fn's.
func Autocommit(ctx context.Context, db Beginner, o Options, fn func(ctx context.Context, q Querier) error) error {
	var err error
	switch d := db.(type) {
	case *pgxpool.Pool:
		err = onPool(ctx, d, fn)
	case Querier:
		err = fn(ctx, d)
	default:
		return Run(ctx, Begin(db), o, Spec{Body: func(ctx context.Context, tx pgx.Tx) error { return fn(ctx, tx) }})
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
