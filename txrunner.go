package txhook

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook/internal/engine"
)

// Beginner starts transactions. *pgxpool.Pool, *pgxpool.Conn and *pgx.Conn
// satisfy it, as do wrappers around them (tracing, tests). A pgx.Tx does
// not: to join a caller's transaction, use Processor.ProcessTx or
// RunTx.
//
// On a *pgxpool.Pool, *pgxpool.Conn or *pgx.Conn, BEGIN travels with the
// transaction's first statement and COMMIT with its deferred statements;
// any other Beginner's BeginTx and Commit cost a round trip each.
type Beginner interface {
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
}

// TxFunc is the work run inside a transaction. It must use tx (not the pool)
// for every statement that should commit or roll back with the transaction.
type TxFunc func(ctx context.Context, tx pgx.Tx) error

// TxOptions configures Run. The zero value (or nil) runs READ COMMITTED,
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

// engine returns the options with their defaults, as the engine takes them.
func (o *TxOptions) engine() engine.Options {
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
	return engine.Options{
		Tx:            pgx.TxOptions{IsoLevel: v.IsoLevel, AccessMode: v.AccessMode},
		MaxAttempts:   v.MaxAttempts,
		BaseBackoff:   v.BaseBackoff,
		MaxBackoff:    v.MaxBackoff,
		FinishTimeout: v.FinishTimeout,
	}
}

// errRollback is returned by a first step or a TxFunc that wants its
// transaction rolled back without reporting an error (a duplicate needs no
// commit).
var errRollback = engine.ErrRollback

// Run runs fn in a new transaction on db and commits it when fn returns nil.
//
// When fn returns an error or panics, the transaction is rolled back (and the
// panic re-raised). A serialization failure or deadlock, from fn or from
// COMMIT, rolls back and runs fn again in a new transaction, up to
// opts.MaxAttempts times with exponential backoff; fn must therefore be safe
// to run again (its effects on the database are rolled back between
// attempts). A COMMIT whose outcome cannot be known, because the connection
// failed while it was in flight, is reported as ErrCommitUnknown and never
// retried: the work may have committed. A database that cannot be used is
// reported as ErrUnavailable. Writes fn sends through Deferred travel with
// its next statement or with COMMIT.
//
// ctx bounds BEGIN and fn, and fn's deferred writes: none is sent once ctx
// has ended. COMMIT and ROLLBACK are bounded by opts.FinishTimeout instead,
// and so are the deferred writes that travel with COMMIT on a pool or
// connection.
func Run(ctx context.Context, db Beginner, opts *TxOptions, fn TxFunc) error {
	return engine.Run(ctx, engine.Begin(db), opts.engine(), engine.Spec{Body: fn})
}

// RunTx runs fn inside tx, the caller's transaction, under a savepoint:
// when fn returns an error or panics, only fn's work is rolled back and tx
// stays usable; when fn returns nil the savepoint is released and fn's work
// commits or rolls back with the caller's transaction. It never retries and
// never commits tx. The savepoint is a round trip of its own before fn's
// first statement, and the writes fn sends through Deferred travel with its
// release. An error that matches ErrTxUnusable means tx cannot be used any
// more (the savepoint could not be rolled back, or fn ended tx with a
// ROLLBACK or COMMIT sent as SQL): roll it back.
func RunTx(ctx context.Context, tx pgx.Tx, fn TxFunc) error {
	return engine.Run(ctx, engine.Savepoint(tx), (*TxOptions)(nil).engine(), engine.Spec{Body: fn})
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
