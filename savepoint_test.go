package txhook_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
)

// TestProcessTxHandlerSavepointLeftOpen: a handler that leaves a savepoint
// it began open on its error path does not take the place of ProcessTx's
// own: the delivery's key and all the handler's writes roll back, and a
// permanent error is recorded as failed.
func TestProcessTxHandlerSavepointLeftOpen(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, noMemory)
	ctx := t.Context()
	leaveOpen := func(wrap func(error) error) txhook.HandlerFunc {
		return func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
			if _, err := tx.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'outer')", ev.Key); err != nil {
				return err
			}
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'inner')", ev.Key); err != nil {
				return err
			}
			_, err = sp.Exec(ctx, "SELECT 1/0")
			return wrap(err) // sp left open
		}
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	res, err := p.ProcessTx(ctx, tx, event("evt_sp_open"), leaveOpen(func(err error) error { return err }))
	if err == nil {
		t.Fatalf("ProcessTx: %v, nil; want the handler's error", res.Outcome)
	}
	res, err = p.ProcessTx(ctx, tx, event("evt_sp_open_permanent"), leaveOpen(txhook.Permanent))
	if err != nil || res.Outcome != txhook.OutcomeFailed {
		t.Fatalf("ProcessTx with a permanent error: %v, %v; want failed", res.Outcome, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"evt_sp_open", "evt_sp_open_permanent"} {
		if n := b.effects(t, key); n != 0 {
			t.Errorf("%s: %d effects committed, want 0", key, n)
		}
	}
	if n := b.count(t, "SELECT count(*) FROM txhook_processed_events WHERE event_key = 'evt_sp_open'"); n != 0 {
		t.Errorf("evt_sp_open: key committed with the caller's transaction")
	}
	var status string
	if err := b.pool.QueryRow(ctx, "SELECT status FROM txhook_processed_events WHERE event_key = 'evt_sp_open_permanent'").Scan(&status); err != nil || status != "failed" {
		t.Errorf("evt_sp_open_permanent: status %q, %v; want failed", status, err)
	}
	mustProcess(t, p, event("evt_sp_open"), insertEffect, txhook.OutcomeProcessed)
}
