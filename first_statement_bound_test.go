package txhook_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
)

// processWithin runs Process and fails the test when it has not returned
// within limit.
func processWithin(t *testing.T, limit time.Duration, p *txhook.Processor, ev txhook.Event, h txhook.HandlerFunc) txhook.Result {
	t.Helper()
	type answer struct {
		res txhook.Result
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		res, err := p.Process(context.Background(), ev, h)
		ch <- answer{res, err}
	}()
	select {
	case a := <-ch:
		if a.err != nil {
			t.Fatalf("process %s: %v", ev.Key, a.err)
		}
		return a.res
	case <-time.After(limit):
		t.Fatalf("process %s: no answer within %v", ev.Key, limit)
	}
	return txhook.Result{}
}

// TestReplayGuardInFlightWithFirstStatement: under DedupeWithFirstStatement
// the replay guard's check is the handler's first statement, sent with the
// dedupe step; its wait on another delivery of the same body is bounded by
// the guard's own LockTimeout, and the delivery is answered
// ErrReplayInFlight after that wait, once, not after a second attempt.
func TestReplayGuardInFlightWithFirstStatement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const wait = 400 * time.Millisecond
	p := b.processor(t, &txhook.Config{DedupeWithFirstStatement: true, RecentKeys: -1})
	g := txhook.ReplayGuard{LockTimeout: wait}
	withHash := func(key string) txhook.Event {
		ev := event(key)
		ev.PayloadHash = []byte("same body")
		return ev
	}
	// Another delivery of the body holds the guard's lock.
	tx, err := b.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if res, err := p.ProcessTx(t.Context(), tx, withHash("evt_first"), g.Handler(insertEffect)); err != nil || res.Outcome != txhook.OutcomeProcessed {
		t.Fatalf("ProcessTx = %v, %v; want processed", res.Outcome, err)
	}

	var calls int
	h := g.Handler(insertEffect)
	start := time.Now()
	_, err = p.Process(t.Context(), withHash("evt_second"), func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		calls++
		return h(ctx, tx, ev)
	})
	elapsed := time.Since(start)
	if !errors.Is(err, txhook.ErrReplayInFlight) {
		t.Fatalf("Process error = %v, want ErrReplayInFlight", err)
	}
	if calls != 1 {
		t.Errorf("handler calls = %d, want 1", calls)
	}
	if limit := wait * 3 / 2; elapsed >= limit {
		t.Errorf("answered after %v, want about the guard's LockTimeout %v (below %v)", elapsed, wait, limit)
	}
}
