package txhook_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
)

// lockWaiters counts the sessions of pool's database waiting on a lock.
func lockWaiters(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

type applyResult struct {
	res txhook.Result
	err error
}

// Two applies of one queued event at once (River running its job twice: a
// rescue while the first worker still runs): the second waits on the row's
// lock while the first runs the handler, then finds the event done. The
// handler runs once and its effect commits once.
func TestConcurrentAppliesOfAQueuedEventRunTheHandlerOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rel := newReleased(t)
	entered := make(chan struct{}, 2)
	h := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		if err := insertEffect(ctx, tx, ev); err != nil {
			return err
		}
		entered <- struct{}{}
		<-rel.ch
		return nil
	}
	p := b.inbox(t, nil, h, &jobQueue{})
	if _, err := accept(t, p, event("q-1"), nil); err != nil {
		t.Fatal(err)
	}
	j := txhook.QueuedJob{Source: "test", Key: "q-1"}
	results := make(chan applyResult, 2)
	apply := func() {
		res, err := p.ApplyQueued(boundedCtx(t), j)
		results <- applyResult{res, err}
	}
	go apply()
	select {
	case <-entered:
	case <-time.After(waitBound):
		t.Fatal("the first apply did not reach the handler")
	}
	go apply()
	deadline := time.After(waitBound)
	for waiting := false; !waiting; {
		select {
		case <-entered:
			t.Error("the second apply ran the handler while the first held the event")
			waiting = true
		case <-deadline:
			t.Fatal("the second apply neither waited on the event's lock nor ran the handler")
		case <-time.After(10 * time.Millisecond):
			waiting = lockWaiters(t, b.pool) > 0
		}
	}
	rel.free()
	outcomes := map[txhook.Outcome]int{}
	for range 2 {
		select {
		case r := <-results:
			if r.err != nil {
				t.Fatalf("ApplyQueued: %v", r.err)
			}
			outcomes[r.res.Outcome]++
		case <-time.After(waitBound):
			t.Fatal("an apply did not finish after the release")
		}
	}
	if outcomes[txhook.OutcomeProcessed] != 1 || outcomes[txhook.OutcomeDuplicate] != 1 {
		t.Errorf("outcomes %v, want one processed and one duplicate", outcomes)
	}
	if n := b.effects(t, "q-1"); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
}

// A second run of a lease-mode inbox job while the first holds its live
// claim (River's rescue of a job whose worker still runs) is answered in
// flight and runs nothing: the first keeps its claim and completes.
func TestQueuedLeaseClaimIsNotTakenWhileLive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rel := newReleased(t)
	claims := make(chan txhook.Claim, 2)
	h := txhook.LeaseHandler{Lease: 10 * time.Second, Work: func(_ context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
		claims <- c
		<-rel.ch
		return func(ctx context.Context, tx pgx.Tx) error { return insertEffect(ctx, tx, ev) }, nil
	}}
	if _, err := b.pool.Exec(t.Context(), `CREATE TABLE jobs (id bigserial PRIMARY KEY, key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	rs := txhook.NewRoutes()
	rs.InboxLease("test", "", h)
	p := b.processor(t, &txhook.Config{Routes: rs})
	if err := p.UseQueue(&jobQueue{}); err != nil {
		t.Fatal(err)
	}
	if _, err := accept(t, p, event("l-1"), nil); err != nil {
		t.Fatal(err)
	}
	j := txhook.QueuedJob{Source: "test", Key: "l-1"}
	run := func(results chan<- applyResult) {
		res, err := p.ApplyQueued(boundedCtx(t), j)
		results <- applyResult{res, err}
	}
	first, second := make(chan applyResult, 1), make(chan applyResult, 1)
	go run(first)
	var c1 txhook.Claim
	select {
	case c1 = <-claims:
	case <-time.After(waitBound):
		t.Fatal("the first run did not claim the event")
	}
	go run(second)
	select {
	case c2 := <-claims:
		t.Errorf("the second run claimed the event (token %d) while the first's claim (token %d) was live", c2.Token, c1.Token)
	case r := <-second:
		if r.err != nil || r.res.Outcome != txhook.OutcomeInFlight || r.res.RetryAfter <= 0 {
			t.Errorf("second run = %+v, %v; want in flight with a retry hint", r.res, r.err)
		}
	case <-time.After(waitBound):
		t.Fatal("the second run did not answer")
	}
	rel.free()
	select {
	case r := <-first:
		if r.err != nil || r.res.Outcome != txhook.OutcomeProcessed {
			t.Errorf("first run = %+v, %v; want processed under its claim", r.res, r.err)
		}
	case <-time.After(waitBound):
		t.Fatal("the first run did not finish after the release")
	}
	if n := b.effects(t, "l-1"); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
}
