package txhook

import (
	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook/internal/engine"
)

// Deferred returns statements that run in tx without a round trip of their
// own, for a handler's writes whose answers it does not need. Its Exec
// queues the statement and returns at once, with an empty command tag and a
// nil error; the queued statements are sent, in order, with the
// transaction's next statement or, at the latest, when it ends (with COMMIT,
// or with RELEASE SAVEPOINT), in the same round trip. A statement belongs
// to the transaction it was deferred on: deferred on tx while a savepoint
// of tx is open (tx.Begin, RunTx, ProcessTx on tx), it is not sent
// with the savepoint's statements, and waits for tx's own next statement
// or end, after the savepoint; it commits with tx whether the savepoint is
// released or rolled back. (A statement sent through tx itself while its
// savepoint is open runs inside the savepoint, as any statement on the
// connection does, and so do the deferred statements sent with it.) Its
// Query and QueryRow
// need their answers: they run at once, after what is queued. Pass it to
// the application's sqlc queries like tx itself:
//
//	q, later := mydb.New(tx), mydb.New(txhook.Deferred(tx))
//	if err := q.InsertOrder(ctx, order); err != nil { ... }
//	if err := later.AddCustomerSpend(ctx, spend); err != nil { ... }
//
// Under Config.DedupeWithFirstStatement, a handler that defers every write
// costs one round trip: its writes travel with BEGIN, the dedupe step and
// COMMIT, and the server skips them when the key is not new.
//
// A queued statement that fails fails the delivery whatever the handler
// returns: its transaction rolls back, and Process returns the error, so
// the sender retries (a serialization failure retries the transaction).
// Queued statements are part of the handler's work: they are sent under its
// context, and not at all once that context has ended (the delivery then
// fails). Defer only writes that the handler would not turn into a
// PermanentError and whose command tag it does not read. A statement's
// arguments are encoded when it is sent: do not change them after the call.
//
// This holds on every path that gives a handler its transaction: Process
// on any database, ProcessTx, Run, RunTx, lease mode's phase two, the
// Replay, and savepoints begun from those transactions. On a transaction
// txhook did not begin (a test's own pgx.Tx passed to a handler directly),
// Deferred returns tx: its statements run at once and return their answers.
func Deferred(tx pgx.Tx) Querier {
	return engine.Deferred(tx)
}
