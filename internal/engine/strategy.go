package engine

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// strategy is how a Tx begins and ends. There is one type per kind of
// Target, and each embeds the Tx it runs (one allocation for both):
//   - connTx, on a pool or a connection: BEGIN travels in the first batch,
//     COMMIT with the deferred statements;
//   - beginnerTx, on any other Beginner (a wrapper): its BeginTx is a round
//     trip of its own, then batches go through the transaction it returns,
//     and COMMIT through that transaction's Commit;
//   - savepointTx, in the caller's transaction: SAVEPOINT is a round trip of
//     its own, before the first batch, and RELEASE SAVEPOINT travels with
//     the deferred statements.
//
// Each type also has its sendBegin, which Tx.sendBegin calls.
type strategy interface {
	// commit ends the transaction with its deferred statements (see
	// Tx.commitStart), under bctx, the body's context, or cctx, the
	// finish's, and returns the classified error of a COMMIT (commitError).
	commit(bctx, cctx context.Context) error
	// rollback rolls back what was sent and ends the Tx. Its error is one
	// that leaves the caller's transaction unusable: a savepoint's.
	rollback(ctx context.Context) error
	// release hands the Tx's connection back, if it took one.
	release()
	// outerErr is the error every statement gets from outside the Tx's own
	// state: the transaction found ended on its connection (Tx.ended) and,
	// for a savepoint, the error of the engine transaction it is in.
	outerErr() error
}

// newTx returns the transaction of one attempt of a run at t.
func newTx(t Target, opts pgx.TxOptions, first firstStep) *Tx {
	switch {
	case t.parent != nil:
		return newSavepoint(t.parent, first, true)
	case batchBegins(t.db):
		c := &connTx{db: t.db, opts: opts}
		c.Tx = Tx{s: c, run: true, first: first}
		return &c.Tx
	}
	b := &beginnerTx{db: t.db, opts: opts}
	b.Tx = Tx{s: b, run: true, first: first}
	return &b.Tx
}

// batchBegins reports whether BEGIN can travel in a batch on d: a pool or a
// connection.
func batchBegins(d Beginner) bool {
	switch d.(type) {
	case *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn:
		return true
	}
	return false
}

// sendBegin sends the first batch: what queue adds, after BEGIN or
// SAVEPOINT as t's strategy needs, in one round trip where it can, and
// reads BEGIN's result; the rest of br is the caller's to read. It sets
// t.under. When it fails, closed reports whether the connection was found
// closed. A statement pgx refused (one that cannot be prepared, arguments
// that cannot be encoded) fails it when BEGIN was in the batch, and is
// otherwise the answer of the batch's first statement.
//
// It calls the strategy's own method, not one of the strategy interface:
// through an interface, queue and the statements it captures would move to
// the heap, two allocations on every run.
func (t *Tx) sendBegin(ctx context.Context, queue func(b *pgx.Batch)) (br pgx.BatchResults, closed bool, err error) {
	switch s := t.s.(type) {
	case *connTx:
		return s.sendBegin(ctx, queue)
	case *beginnerTx:
		return s.sendBegin(ctx, queue)
	}
	return t.s.(*savepointTx).sendBegin(ctx, queue)
}
