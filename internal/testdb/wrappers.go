package testdb

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// OnlyBegins is a database wrapper (as an instrumented or multi-tenant
// wrapper would be) that only begins transactions: neither a pool nor a
// connection, so BEGIN cannot travel in a batch on it, and nothing runs on
// it outside a transaction.
type OnlyBegins struct{ Pool *pgxpool.Pool }

// BeginTx begins a transaction on the pool.
func (w OnlyBegins) BeginTx(ctx context.Context, o pgx.TxOptions) (pgx.Tx, error) {
	return w.Pool.BeginTx(ctx, o)
}

// BeginsAndRuns is a wrapper that also runs statements directly, as tracing
// wrappers do: still not a pool or a connection.
type BeginsAndRuns struct{ Pool *pgxpool.Pool }

// BeginTx begins a transaction on the pool.
func (w BeginsAndRuns) BeginTx(ctx context.Context, o pgx.TxOptions) (pgx.Tx, error) {
	return w.Pool.BeginTx(ctx, o)
}

// Exec runs a statement on the pool.
func (w BeginsAndRuns) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return w.Pool.Exec(ctx, sql, args...)
}

// Query runs a query on the pool.
func (w BeginsAndRuns) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return w.Pool.Query(ctx, sql, args...)
}

// QueryRow runs a one-row query on the pool.
func (w BeginsAndRuns) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return w.Pool.QueryRow(ctx, sql, args...)
}
