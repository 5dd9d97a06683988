package engine

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Deferred statements: a body's writes whose answers it does not need wait
// in their Tx's queue and travel with its next statement (Tx.send) or with
// its end (the strategy's commit). A statement belongs to the Tx it was
// deferred on: a savepoint's statements go past it (savepointTx.enclosing).

// Deferred returns a Querier whose Exec queues its statement in tx, when tx
// is an engine transaction, and tx itself otherwise.
func Deferred(tx pgx.Tx) Querier {
	if t, ok := tx.(*Tx); ok {
		return deferred{t}
	}
	return tx
}

// deferred is the Querier Deferred returns.
type deferred struct{ t *Tx }

// Exec queues the statement and returns an empty command tag.
func (d deferred) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, d.t.deferExec(sql, args)
}

// Query runs at once, after what is queued.
func (d deferred) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return d.t.Query(ctx, sql, args...)
}

// QueryRow runs at once, after what is queued.
func (d deferred) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return d.t.QueryRow(ctx, sql, args...)
}

// deferExec queues a statement (see Deferred).
func (t *Tx) deferExec(sql string, args []any) error {
	if err := t.err(); err != nil {
		return err
	}
	t.queue = append(t.queue, stmt{sql: sql, args: args})
	return nil
}
