package txhook

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txhook/txhook/db"
)

// Deferred returns statements that run in tx without a round trip of their
// own, for a handler's writes whose answers it does not need. Its Exec
// queues the statement and returns at once, with an empty command tag and a
// nil error; the queued statements are sent, in order, with the
// transaction's next statement or, at the latest, with its COMMIT, in the
// same round trip. Its Query and QueryRow need their answers: they run at
// once, after what is queued. Pass it to the application's sqlc queries
// like tx itself:
//
//	q, later := mydb.New(tx), mydb.New(txhook.Deferred(tx))
//	if err := q.InsertOrder(ctx, order); err != nil { ... }
//	if err := later.AddCustomerSpend(ctx, spend); err != nil { ... }
//
// A queued statement that fails fails the delivery whatever the handler
// returns: its transaction rolls back, and Process returns the error, so
// the sender retries (a serialization failure retries the transaction).
// Defer only writes that the handler would not turn into a PermanentError
// and whose command tag it does not read. A statement's arguments are
// encoded when it is sent: do not change them after the call.
//
// Statements are deferred in the transaction Process begins on a
// *pgxpool.Pool, *pgxpool.Conn or *pgx.Conn. On any other transaction
// (ProcessTx, RunTx, a savepoint, a test's own pgx.Tx) Deferred returns tx:
// its statements run at once and return their answers.
func Deferred(tx pgx.Tx) db.DBTX {
	if lt, ok := tx.(*lazyTx); ok {
		return deferredDB{lt}
	}
	return tx
}

// deferredDB is the db.DBTX Deferred returns for a lazyTx.
type deferredDB struct{ lt *lazyTx }

// Exec implements db.DBTX: it queues the statement.
func (d deferredDB) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, d.lt.deferExec(sql, args)
}

// Query implements db.DBTX: it runs at once, after what is queued.
func (d deferredDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return d.lt.Query(ctx, sql, args...)
}

// QueryRow implements db.DBTX: it runs at once, after what is queued.
func (d deferredDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return d.lt.QueryRow(ctx, sql, args...)
}
