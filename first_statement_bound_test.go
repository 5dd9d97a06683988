package txhook_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
)

// processWithin runs Process and fails the test when it has not returned
// within limit.
func processWithin(t *testing.T, limit time.Duration, p *txhook.Processor, ev txhook.Event, h txhook.HandlerFunc) txhook.Result {
	t.Helper()
	ch := inBackground(func() (txhook.Result, error) { return p.Process(context.Background(), ev, h) })
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

// TestBodyDedupeInFlightWithFirstStatement: under DedupeWithFirstStatement
// the body dedupe's check is the handler's first statement, sent with the
// dedupe step; its wait on another delivery of the same body is bounded by
// the guard's own LockTimeout, and the delivery is answered
// in flight after that wait, once, not after a second attempt.
func TestBodyDedupeInFlightWithFirstStatement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const wait = 400 * time.Millisecond
	var calls int
	rs := txhook.NewRoutes()
	rs.Transactional("test", "", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		calls++
		return insertEffect(ctx, tx, ev)
	})
	p := b.processor(t, &txhook.Config{Routes: rs, DedupeWithFirstStatement: true, RecentKeys: -1})
	g := &txhook.DeliverOptions{BodyDedupe: &txhook.BodyDedupe{LockTimeout: wait}}
	withHash := func(key string) txhook.Event {
		ev := event(key)
		ev.PayloadHash = []byte("same body")
		return ev
	}
	// Another delivery of the body holds the guard's lock: its transaction
	// is still open.
	entered, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	hold := txhook.NewRoutes()
	hold.Transactional("test", "", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		close(entered)
		<-release
		return insertEffect(ctx, tx, ev)
	})
	holder := b.processor(t, &txhook.Config{Routes: hold, RecentKeys: -1})
	go func() {
		_, err := holder.Deliver(context.Background(), withHash("evt_first"), g)
		first <- err
	}()
	select {
	case <-entered:
	case <-time.After(waitBound):
		t.Fatal("the first delivery did not reach its handler")
	}
	defer func() {
		close(release)
		if err := <-first; err != nil {
			t.Errorf("first delivery: %v", err)
		}
	}()

	start := time.Now()
	res, err := p.Deliver(t.Context(), withHash("evt_second"), g)
	elapsed := time.Since(start)
	if err != nil || res.Outcome != txhook.OutcomeInFlight || res.RetryAfter != wait {
		t.Fatalf("Deliver = %+v, %v; want in flight, retry after the guard's %v", res, err, wait)
	}
	if calls != 0 {
		t.Errorf("handler calls = %d, want 0: the guard's check came first", calls)
	}
	if limit := wait * 3 / 2; elapsed >= limit {
		t.Errorf("answered after %v, want about the guard's LockTimeout %v (below %v)", elapsed, wait, limit)
	}
}
