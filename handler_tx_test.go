package txhook_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
)

// TestHandlerTransaction: a handler cannot commit or roll back the event's
// transaction, and the savepoints it begins work as pgx's do, with deferred
// writes applied at their release and dropped at their rollback.
func TestHandlerTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, first := range []bool{false, true} {
		p := b.processor(t, &txhook.Config{DedupeWithFirstStatement: first, RecentKeys: -1})
		key := map[bool]string{false: "evt_sp_a", true: "evt_sp_b"}[first]
		res := processWithin(t, 10*time.Second, p, event(key), func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
			if err := tx.Commit(ctx); err == nil {
				t.Errorf("first=%v: the handler committed the event's transaction", first)
			}
			if err := tx.Rollback(ctx); err == nil {
				t.Errorf("first=%v: the handler rolled back the event's transaction", first)
			}
			undone, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := undone.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'undone')", ev.Key); err != nil {
				return err
			}
			if err := deferNote(ctx, undone, ev.Key, "undone-deferred"); err != nil {
				return err
			}
			if err := undone.Rollback(ctx); err != nil {
				return err
			}
			kept, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if err := deferNote(ctx, kept, ev.Key, "kept-deferred"); err != nil {
				return err
			}
			return kept.Commit(ctx)
		})
		if res.Outcome != txhook.OutcomeProcessed {
			t.Fatalf("first=%v: outcome %v, want processed", first, res.Outcome)
		}
		if n := b.count(t, "SELECT count(*) FROM effects WHERE event_key = $1 AND note = 'kept-deferred'", key); n != 1 {
			t.Errorf("first=%v: %d kept deferred writes, want 1", first, n)
		}
		if n := b.count(t, "SELECT count(*) FROM effects WHERE event_key = $1 AND note LIKE 'undone%'", key); n != 0 {
			t.Errorf("first=%v: %d writes of a rolled back savepoint", first, n)
		}
	}
}

// deferNote queues an effect row with note through txhook.Deferred.
func deferNote(ctx context.Context, tx pgx.Tx, key, note string) error {
	_, err := txhook.Deferred(tx).Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, $2)", key, note)
	return err
}
