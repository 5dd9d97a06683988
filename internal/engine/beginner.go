package engine

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// beginnerTx is a transaction of a Beginner that is neither a pool nor a
// connection (a tracing or multi-tenant wrapper): its BeginTx is a round
// trip of its own, batches then go through the transaction it returns, and
// COMMIT through that transaction's Commit.
type beginnerTx struct {
	Tx
	db   Beginner
	opts pgx.TxOptions
}

// sendBegin is Tx.sendBegin. A BeginTx that failed because the
// database could not be used (the wrapper met a connection the server had
// ended) is tried once more: nothing was sent.
func (b *beginnerTx) sendBegin(ctx context.Context, queue func(b *pgx.Batch)) (pgx.BatchResults, bool, error) {
	tx, err := b.db.BeginTx(ctx, b.opts)
	if err != nil && Unreachable(err) {
		tx, err = b.db.BeginTx(ctx, b.opts)
	}
	if err != nil {
		return nil, false, err
	}
	b.under = tx
	batch := &pgx.Batch{}
	queue(batch)
	return tx.SendBatch(ctx, batch), false, nil
}

// commit implements strategy: the deferred statements are sent under bctx,
// the body's context, then COMMIT under cctx.
func (b *beginnerTx) commit(bctx, cctx context.Context) error {
	if ended, err := b.commitStart(bctx, cctx); ended {
		return commitError(err)
	}
	if len(b.queue) > 0 {
		if err := b.send(bctx, nil); err != nil {
			return commitError(b.abortWith(cctx, 0, &rolledBackError{err: err}))
		}
	}
	lost := b.connClosed() // the wrapper may hand its connection back in Commit
	err := b.under.Commit(cctx)
	b.endWith(lost)
	return commitError(err)
}

// rollback implements strategy; its error is of no consequence (see
// connTx.rollback).
func (b *beginnerTx) rollback(ctx context.Context) error {
	lost := b.connClosed() // the wrapper may hand its connection back in Rollback
	_ = b.under.Rollback(ctx)
	b.endWith(lost)
	return nil
}

// release implements strategy: the wrapper's transaction hands its
// connection back itself.
func (b *beginnerTx) release() {}

// outerErr implements strategy.
func (b *beginnerTx) outerErr() error {
	if b.ended() {
		return errTxEnded
	}
	return nil
}
