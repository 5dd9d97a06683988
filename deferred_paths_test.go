package txhook_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txhook/txhook"
)

// TestDeferredUnderProcessTx: under ProcessTx, as under Process, a deferred
// Exec is queued (empty command tag), sent no later than the savepoint's
// release, and a deferred statement that fails fails the delivery: its
// savepoint rolls back and the caller's transaction stays usable.
func TestDeferredUnderProcessTx(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, noMemory)
	ctx := t.Context()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())

	var tag pgconn.CommandTag
	res, err := p.ProcessTx(ctx, tx, event("evt_tx_deferred"), func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		var err error
		tag, err = txhook.Deferred(tx).Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'deferred')", ev.Key)
		return err
	})
	if err != nil || res.Outcome != txhook.OutcomeProcessed {
		t.Fatalf("ProcessTx: %v, %v; want processed", res.Outcome, err)
	}
	if tag.RowsAffected() != 0 || tag.String() != "" {
		t.Errorf("deferred Exec answered %q, want an empty command tag", tag.String())
	}

	res, err = p.ProcessTx(ctx, tx, event("evt_tx_deferred_fails"), func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		if err := insertEffect(ctx, tx, ev); err != nil {
			return err
		}
		_, err := txhook.Deferred(tx).Exec(ctx, "INSERT INTO no_such_table VALUES (1)")
		return err // nil: the statement is queued
	})
	if err == nil || !errors.As(err, new(*pgconn.PgError)) {
		t.Errorf("ProcessTx with a failing deferred statement: %+v, %v; want the statement's error", res, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("the caller's transaction is not usable after the failed delivery: %v", err)
	}
	if n := b.effects(t, "evt_tx_deferred"); n != 1 {
		t.Errorf("evt_tx_deferred: %d effects, want 1", n)
	}
	if n := b.effects(t, "evt_tx_deferred_fails"); n != 0 {
		t.Errorf("evt_tx_deferred_fails: %d effects, want 0", n)
	}
	if n := b.count(t, "SELECT count(*) FROM txhook_processed_events WHERE event_key = 'evt_tx_deferred_fails'"); n != 0 {
		t.Errorf("evt_tx_deferred_fails: %d key rows, want 0 (not recorded, not failed)", n)
	}
}

// TestDeferredNotSentAfterContextEnds: deferred statements are part of the
// handler's work. A handler whose context has ended by the time it returns
// gets none of its deferred writes sent, and nothing commits, on every
// path.
func TestDeferredNotSentAfterContextEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, first := range []bool{false, true} {
		p := b.processor(t, &txhook.Config{DedupeWithFirstStatement: first, RecentKeys: -1})
		key := map[bool]string{false: "evt_ctx_a", true: "evt_ctx_b"}[first]
		ctx, cancel := context.WithCancel(t.Context())
		_, err := p.Process(ctx, event(key), func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
			if err := insertEffect(ctx, tx, ev); err != nil {
				return err
			}
			if err := deferNote(ctx, tx, ev.Key, "deferred"); err != nil {
				return err
			}
			cancel() // the request ends before the handler returns
			return nil
		})
		cancel()
		if !errors.Is(err, context.Canceled) {
			t.Errorf("first=%v: Process = %v, want context.Canceled", first, err)
		}
		if n := b.effects(t, key); n != 0 {
			t.Errorf("first=%v: %d effects committed", first, n)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	err := txhook.RunTx(ctx, b.pool, nil, func(ctx context.Context, tx pgx.Tx) error {
		if err := deferNote(ctx, tx, "run-tx-ctx", "deferred"); err != nil {
			return err
		}
		cancel()
		return nil
	})
	cancel()
	if !errors.Is(err, context.Canceled) {
		t.Errorf("RunTx = %v, want context.Canceled", err)
	}
	if n := b.effects(t, "run-tx-ctx"); n != 0 {
		t.Errorf("RunTx: %d effects committed", n)
	}
}
