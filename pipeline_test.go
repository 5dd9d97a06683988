package txhook_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/internal/pgtrace"
)

// tracedProcessor returns a processor configured by cfg on a traced pool of
// one connection (see pgtrace.Pool).
func tracedProcessor(t *testing.T, b *bundle, cfg *txhook.Config) (*txhook.Processor, *pgtrace.Recorder) {
	t.Helper()
	pool, tr := pgtrace.Pool(t, b.db.URL)
	p, err := txhook.NewProcessor(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p, tr
}

func TestLeaseDoneMarkSharesRoundTripWithBegin(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p, tr := tracedProcessor(t, b, noMemory)
	h := txhook.LeaseHandler{
		Lease: 10 * time.Second,
		Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
			return func(ctx context.Context, tx pgx.Tx) error { return insertEffect(ctx, tx, ev) }, nil
		},
	}
	lease := func(key string) {
		t.Helper()
		res, err := p.ProcessLease(t.Context(), event(key), h)
		if err != nil || res.Outcome != txhook.OutcomeProcessed {
			t.Fatalf("process lease %s: %v, %v", key, res.Outcome, err)
		}
	}
	lease("evt_lease_warm")
	tr.Take()
	lease("evt_lease_rt")
	want := [][]string{
		{"ClaimEvent"},
		{"begin", "CompleteLease"},
		{"insert into effects (event_key) values ($1)"},
		{"commit"},
	}
	if got := tr.Take(); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("round trips %q, want %q", got, want)
	}
	if n := b.effects(t, "evt_lease_rt"); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
}
