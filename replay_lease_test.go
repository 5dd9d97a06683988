package txhook_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
)

// A failed lease-mode event is replayed through its lease handler: a new
// claim runs the external work again and commits the business write with
// the done mark; a second replay is a duplicate.
func TestReplayerReplaysLeaseModeEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, &txhook.Config{StorePayload: true})
	ev := event("evt_lease_failed")
	ev.Type = "payment_intent.succeeded"

	var calls []string // idempotency keys of the external calls
	fail := true
	lh := txhook.LeaseHandler{Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
		calls = append(calls, c.IdempotencyKey("ship"))
		if fail {
			return nil, txhook.Permanent(errors.New("carrier refused the address"))
		}
		return func(ctx context.Context, tx pgx.Tx) error { return insertEffect(ctx, tx, ev) }, nil
	}}
	res, err := p.ProcessLease(t.Context(), ev, lh)
	if err != nil || res.Outcome != txhook.OutcomeFailed {
		t.Fatalf("ProcessLease = %v, %v; want failed", res.Outcome, err)
	}

	noTx := func(string) (txhook.HandlerFunc, bool) { return nil, false }
	if _, err := txhook.NewReplayer(b.pool, noTx, &txhook.ReplayerConfig{
		LeaseLookup: func(string) (txhook.LeaseHandler, bool) { return lh, true },
	}); err == nil {
		t.Fatal("LeaseLookup without Processor accepted")
	}
	r, err := txhook.NewReplayer(b.pool, noTx, &txhook.ReplayerConfig{
		Processor: p,
		LeaseLookup: func(typ string) (txhook.LeaseHandler, bool) {
			return lh, typ == "payment_intent.succeeded"
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	fail = false
	if res, err := r.Replay(t.Context(), ev.Source, ev.Key); err != nil || res.Outcome != txhook.OutcomeProcessed {
		t.Fatalf("Replay = %v, %v; want processed", res.Outcome, err)
	}
	if res, err := r.Replay(t.Context(), ev.Source, ev.Key); err != nil || res.Outcome != txhook.OutcomeDuplicate {
		t.Fatalf("second Replay = %v, %v; want duplicate", res.Outcome, err)
	}
	if n := b.effects(t, ev.Key); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
	if len(calls) != 2 || calls[0] != calls[1] {
		t.Errorf("external calls = %v, want two with the same idempotency key", calls)
	}
}
