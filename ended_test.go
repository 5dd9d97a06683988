package txhook_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
)

// TestHandlerEndingItsTransaction: a handler that sends ROLLBACK or COMMIT
// as SQL and then writes (ignoring every error) is never answered
// processed, on any delivery of its key, and its write never commits: the
// write would run outside any transaction, committed on its own, so it is
// refused, and the delivery fails. Under ProcessTx the transaction that
// ended is the caller's: the error matches ErrTxUnusable.
func TestHandlerEndingItsTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	endThenWrite := func(end string) txhook.HandlerFunc {
		return func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
			_, _ = tx.Exec(ctx, end)
			_ = insertEffect(ctx, tx, ev)
			return nil
		}
	}
	for _, first := range []bool{false, true} {
		p := b.processor(t, &txhook.Config{DedupeWithFirstStatement: first, RecentKeys: -1})
		for _, end := range []string{"ROLLBACK", "COMMIT"} {
			name := fmt.Sprintf("%s, DedupeWithFirstStatement=%v", end, first)
			ev := event(fmt.Sprintf("evt_%s_%v", end, first))
			for delivery := 1; delivery <= 3; delivery++ {
				res, err := p.Process(boundedCtx(t), ev, endThenWrite(end))
				if err == nil && res.Outcome == txhook.OutcomeProcessed {
					t.Errorf("%s: delivery %d answered processed", name, delivery)
				}
			}
			if n := b.effects(t, ev.Key); n != 0 {
				t.Errorf("%s: %d effects after three deliveries, want 0", name, n)
			}

			tx, err := b.pool.Begin(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			txEv := event(ev.Key + "_tx")
			if _, err := p.ProcessTx(t.Context(), tx, txEv, endThenWrite(end)); !errors.Is(err, txhook.ErrTxUnusable) {
				t.Errorf("%s: ProcessTx = %v, want ErrTxUnusable", name, err)
			}
			_ = tx.Rollback(context.Background())
			if n := b.effects(t, txEv.Key); n != 0 {
				t.Errorf("%s: ProcessTx left %d effects, want 0", name, n)
			}
		}
	}
}
