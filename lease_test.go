package txhook_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/db"
	"github.com/txhook/txhook/internal/testdb"
)

// externalAPI is a real HTTP server standing in for a downstream API (a
// payment provider). It counts the requests it gets per Idempotency-Key.
type externalAPI struct {
	srv *httptest.Server

	mu    sync.Mutex
	calls map[string]int
}

func newExternalAPI(t *testing.T) *externalAPI {
	t.Helper()
	a := &externalAPI{calls: map[string]int{}}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.calls[r.Header.Get("Idempotency-Key")]++
		a.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(a.srv.Close)
	return a
}

// charge calls the API with key as its Idempotency-Key.
func (a *externalAPI) charge(ctx context.Context, key string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.srv.URL+"/charges", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := a.srv.Client().Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("charge: status %d", resp.StatusCode)
	}
	return nil
}

// snapshot returns the calls per key.
func (a *externalAPI) snapshot() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := make(map[string]int, len(a.calls))
	for k, v := range a.calls {
		m[k] = v
	}
	return m
}

// wantCalls fails t unless the API got exactly n calls, all with key.
func (a *externalAPI) wantCalls(t *testing.T, key string, n int) {
	t.Helper()
	got := a.snapshot()
	if len(got) != 1 || got[key] != n {
		t.Errorf("external calls = %v, want %d with key %s", got, n, key)
	}
}

type leaseBundle struct {
	pool *pgxpool.Pool
	api  *externalAPI
	p    *txhook.Processor
}

func leaseSetup(t *testing.T) *leaseBundle {
	t.Helper()
	d := testdb.New(t)
	if _, err := d.Pool.Exec(t.Context(), `CREATE TABLE lease_effects (
		event_key text NOT NULL,
		worker    text NOT NULL
	)`); err != nil {
		t.Fatal(err)
	}
	p, err := txhook.NewProcessor(d.Pool, &txhook.Config{StorePayload: true})
	if err != nil {
		t.Fatal(err)
	}
	return &leaseBundle{pool: d.Pool, api: newExternalAPI(t), p: p}
}

func leaseEvent(key string) txhook.Event {
	return txhook.Event{Source: "test", Key: key, Type: "invoice.paid", Payload: []byte(`{"id":"` + key + `"}`)}
}

// chargeAndRecord is the usual lease-mode handler: one external call with the
// event's idempotency key, then one business row written by worker.
func (b *leaseBundle) chargeAndRecord(worker string) txhook.LeaseFunc {
	return func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
		if err := b.api.charge(ctx, c.IdempotencyKey("charge")); err != nil {
			return nil, err
		}
		return recordEffect(ev.Key, worker), nil
	}
}

func recordEffect(key, worker string) txhook.TxFunc {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO lease_effects (event_key, worker) VALUES ($1, $2)", key, worker)
		return err
	}
}

// effects returns the workers whose business rows for key committed.
func (b *leaseBundle) effects(t *testing.T, key string) []string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), "SELECT worker FROM lease_effects WHERE event_key = $1 ORDER BY worker", key)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return ws
}

func (b *leaseBundle) row(t *testing.T, key string) db.TxhookProcessedEvent {
	t.Helper()
	r, err := db.New(b.pool).GetEvent(context.Background(), db.GetEventParams{Source: "test", EventKey: key})
	if err != nil {
		t.Fatalf("get event %s: %v", key, err)
	}
	return r
}

func (b *leaseBundle) mustLease(t *testing.T, ev txhook.Event, h txhook.LeaseHandler, want txhook.Outcome) txhook.Result {
	t.Helper()
	res, err := b.p.ProcessLease(t.Context(), ev, h)
	if err != nil {
		t.Fatalf("process lease %s: %v", ev.Key, err)
	}
	if res.Outcome != want {
		t.Fatalf("process lease %s: outcome %v, want %v", ev.Key, res.Outcome, want)
	}
	return res
}

// blocked runs ProcessLease in a goroutine whose Work signals started and
// then waits for release before calling next.
type blocked struct {
	started chan txhook.Claim
	release chan struct{}
	done    chan struct{}
	res     txhook.Result
	err     error
	cause   error // context.Cause of Work's context when Work returned
}

// startBlocked starts a blocked delivery of ev under t's context. When t
// ends, the delivery is released (and its context cancelled) and waited for,
// so that a failing test never leaves it holding its claim.
func (b *leaseBundle) startBlocked(t *testing.T, ev txhook.Event, h txhook.LeaseHandler, waitForCtx bool) *blocked {
	bl := &blocked{started: make(chan txhook.Claim, 1), release: make(chan struct{}), done: make(chan struct{})}
	next := h.Work
	h.Work = func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
		bl.started <- c
		if waitForCtx {
			<-ctx.Done()
		} else {
			<-bl.release // a worker that does not notice its lease ending
		}
		bl.cause = context.Cause(ctx)
		return next(ctx, c, ev)
	}
	ctx := t.Context()
	go func() {
		defer close(bl.done)
		bl.res, bl.err = b.p.ProcessLease(ctx, ev, h)
	}()
	t.Cleanup(func() { bl.finish(t) })
	return bl
}

func (bl *blocked) claim(t *testing.T) txhook.Claim {
	t.Helper()
	select {
	case c := <-bl.started:
		return c
	case <-bl.done:
		t.Fatalf("blocked delivery ended before its work started: %v, %v", bl.res, bl.err)
	case <-time.After(waitBound):
		t.Fatal("blocked delivery did not start")
	}
	return txhook.Claim{}
}

// finish releases the delivery and waits for it to end.
func (bl *blocked) finish(t *testing.T) {
	t.Helper()
	select {
	case <-bl.release:
	default:
		close(bl.release)
	}
	select {
	case <-bl.done:
	case <-time.After(waitBound):
		t.Fatal("blocked delivery did not finish")
	}
}

// renewalNotice bounds the wait for a worker's heartbeat to find its claim
// gone: a few renewal periods of the renewal tests, and far short of their
// leases (10s), whose end alone would also stop the work.
const renewalNotice = 3 * time.Second

// until calls fn every few milliseconds until it returns true, failing t
// after waitBound.
func until(t *testing.T, what string, fn func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for !fn() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestLeaseProcessesOnceThenDuplicate(t *testing.T) {
	t.Parallel()
	b := leaseSetup(t)
	ev := leaseEvent("evt_once")
	var tokens []int
	h := txhook.LeaseHandler{Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
		tokens = append(tokens, c.Token)
		if _, ok := ctx.Deadline(); ok {
			return nil, errors.New("renewing work context has a fixed deadline")
		}
		return b.chargeAndRecord("w1")(ctx, c, ev)
	}}

	b.mustLease(t, ev, h, txhook.OutcomeProcessed)
	b.mustLease(t, ev, h, txhook.OutcomeDuplicate)

	if len(tokens) != 1 || tokens[0] != 1 {
		t.Errorf("work ran with tokens %v, want once with token 1", tokens)
	}
	b.api.wantCalls(t, txhook.IdempotencyKey("test", "evt_once", "charge"), 1)
	if got := b.effects(t, ev.Key); len(got) != 1 {
		t.Errorf("effects = %v, want one", got)
	}
	r := b.row(t, ev.Key)
	if r.Status != "done" || r.Attempts != 1 || r.LeaseExpiresAt.Valid || !r.CompletedAt.Valid ||
		r.EventType != "invoice.paid" || string(r.Payload) != string(ev.Payload) {
		t.Errorf("row = %+v, want done, attempts 1, no lease, completed, with type and payload", r)
	}
}

func TestLeaseInFlightDuplicate(t *testing.T) {
	t.Parallel()
	b := leaseSetup(t)
	ev := leaseEvent("evt_inflight")
	const lease = 10 * time.Second
	start := time.Now()
	first := b.startBlocked(t, ev, txhook.LeaseHandler{Lease: lease, RenewEvery: -1, Work: b.chargeAndRecord("first")}, false)
	first.claim(t)

	ran := false
	second := txhook.LeaseHandler{Lease: lease, Work: func(context.Context, txhook.Claim, txhook.Event) (txhook.TxFunc, error) {
		ran = true
		return nil, nil
	}}
	res := b.mustLease(t, ev, second, txhook.OutcomeInFlight)
	// The claim's lease ends at most lease after start, and at least lease
	// after start minus the time taken so far; RetryAfter is rounded up to
	// whole seconds.
	elapsed := time.Since(start)
	if res.RetryAfter > lease || res.RetryAfter < lease-elapsed || res.RetryAfter%time.Second != 0 {
		t.Errorf("RetryAfter = %v, want whole seconds in [%v, %v]", res.RetryAfter, lease-elapsed, lease)
	}
	// A transactional-mode delivery of the same key is in flight too.
	tres, err := b.p.Process(t.Context(), ev, func(context.Context, pgx.Tx, txhook.Event) error {
		ran = true
		return nil
	})
	if err != nil || tres.Outcome != txhook.OutcomeInFlight {
		t.Errorf("transactional delivery during a claim = %v, %v; want in flight", tres, err)
	}
	if ran {
		t.Error("a handler ran while another delivery held the claim")
	}

	first.finish(t)
	if first.err != nil || first.res.Outcome != txhook.OutcomeProcessed {
		t.Fatalf("first delivery = %v, %v; want processed", first.res, first.err)
	}
	b.mustLease(t, ev, second, txhook.OutcomeDuplicate)
	if ran {
		t.Error("second handler ran after the first completed")
	}
	b.api.wantCalls(t, txhook.IdempotencyKey("test", ev.Key, "charge"), 1)
}

func TestLeaseConcurrentDeliveriesRunOnce(t *testing.T) {
	t.Parallel()
	b := leaseSetup(t)
	ev := leaseEvent("evt_concurrent")
	const n = 8
	var wg sync.WaitGroup
	results := make([]txhook.Result, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = b.p.ProcessLease(t.Context(), ev, txhook.LeaseHandler{Work: b.chargeAndRecord(fmt.Sprint("w", i))})
		}()
	}
	wg.Wait()
	processed := 0
	for i := range n {
		switch {
		case errs[i] != nil:
			t.Errorf("delivery %d: %v", i, errs[i])
		case results[i].Outcome == txhook.OutcomeProcessed:
			processed++
		case results[i].Outcome != txhook.OutcomeInFlight && results[i].Outcome != txhook.OutcomeDuplicate:
			t.Errorf("delivery %d: outcome %v", i, results[i].Outcome)
		}
	}
	if processed != 1 {
		t.Errorf("%d deliveries processed, want 1", processed)
	}
	if got := b.effects(t, ev.Key); len(got) != 1 {
		t.Errorf("effects = %v, want one", got)
	}
	b.api.wantCalls(t, txhook.IdempotencyKey("test", ev.Key, "charge"), 1)
}

func TestLeaseTransactionalDoneIsDuplicate(t *testing.T) {
	t.Parallel()
	b := leaseSetup(t)
	ev := leaseEvent("evt_tx_done")
	res, err := b.p.Process(t.Context(), ev, func(context.Context, pgx.Tx, txhook.Event) error { return nil })
	if err != nil || res.Outcome != txhook.OutcomeProcessed {
		t.Fatalf("transactional delivery = %v, %v", res, err)
	}
	b.mustLease(t, ev, txhook.LeaseHandler{Work: b.chargeAndRecord("lease")}, txhook.OutcomeDuplicate)
	if got := b.api.snapshot(); len(got) != 0 {
		t.Errorf("external calls = %v for a duplicate", got)
	}
	if r := b.row(t, ev.Key); r.Status != "done" || r.Attempts != 1 {
		t.Errorf("row = %+v, want the transactional done row untouched", r)
	}
}

// TestLeaseExpiryTakeoverAndStaleWorkerFenced: a worker stalls past its
// lease; another delivery takes the event over and completes it; when the
// stale worker wakes up, its completion is rejected by the fencing token and
// its phase-two writes are rolled back.
func TestLeaseExpiryTakeoverAndStaleWorkerFenced(t *testing.T) {
	t.Parallel()
	b := leaseSetup(t)
	ev := leaseEvent("evt_takeover")
	const lease = 300 * time.Millisecond
	claimStart := time.Now()
	// The stale worker ignores its context's end (a call already on the
	// wire, a long GC pause): its work succeeds and it reaches phase two.
	staleWork := func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
		return b.chargeAndRecord("stale")(context.WithoutCancel(ctx), c, ev)
	}
	stale := b.startBlocked(t, ev, txhook.LeaseHandler{Lease: lease, RenewEvery: -1, Work: staleWork}, false)
	if c := stale.claim(t); c.Token != 1 {
		t.Fatalf("first claim token = %d, want 1", c.Token)
	}

	var takeover txhook.Claim
	h := txhook.LeaseHandler{Lease: 10 * time.Second, Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
		takeover = c
		return b.chargeAndRecord("new")(ctx, c, ev)
	}}
	until(t, "takeover after the lease ends", func() bool {
		res, err := b.p.ProcessLease(t.Context(), ev, h)
		if err != nil {
			t.Fatalf("takeover delivery: %v", err)
		}
		if res.Outcome == txhook.OutcomeInFlight {
			return false
		}
		if res.Outcome != txhook.OutcomeProcessed {
			t.Fatalf("takeover delivery: outcome %v", res.Outcome)
		}
		return true
	})
	if since := time.Since(claimStart); since < lease {
		t.Errorf("taken over after %v, before the %v lease ended", since, lease)
	}
	if takeover.Token != 2 {
		t.Errorf("takeover token = %d, want 2", takeover.Token)
	}

	stale.finish(t)
	if !errors.Is(stale.err, txhook.ErrLeaseLost) {
		t.Errorf("stale worker = %v, %v; want ErrLeaseLost", stale.res, stale.err)
	}
	if !errors.Is(stale.cause, txhook.ErrLeaseLost) {
		t.Errorf("stale worker's context cause = %v, want ErrLeaseLost", stale.cause)
	}
	if got := b.effects(t, ev.Key); len(got) != 1 || got[0] != "new" {
		t.Errorf("effects = %v, want only the new owner's", got)
	}
	if r := b.row(t, ev.Key); r.Status != "done" || r.Attempts != 2 {
		t.Errorf("row = %+v, want done by attempt 2", r)
	}
	// The external call ran twice, both times with the same key, so the
	// downstream API can drop the repeat.
	b.api.wantCalls(t, txhook.IdempotencyKey("test", ev.Key, "charge"), 2)
}

// TestLeaseRenewalKeepsLongHandlersClaim: a handler that runs for several
// leases keeps its claim through renewals; every other delivery meanwhile is
// in flight.
func TestLeaseRenewalKeepsLongHandlersClaim(t *testing.T) {
	t.Parallel()
	b := leaseSetup(t)
	ev := leaseEvent("evt_long")
	const lease = time.Second
	long := b.startBlocked(t, ev, txhook.LeaseHandler{Lease: lease, RenewEvery: 100 * time.Millisecond, Work: b.chargeAndRecord("long")}, false)
	long.claim(t)
	start := time.Now()

	other := txhook.LeaseHandler{Lease: lease, Work: b.chargeAndRecord("other")}
	deliveries := 0
	for time.Since(start) < 3*lease {
		b.mustLease(t, ev, other, txhook.OutcomeInFlight)
		deliveries++
		time.Sleep(20 * time.Millisecond)
	}
	long.finish(t)
	if long.err != nil || long.res.Outcome != txhook.OutcomeProcessed {
		t.Fatalf("long handler = %v, %v; want processed", long.res, long.err)
	}
	if long.cause != nil {
		t.Errorf("long handler's context ended: %v", long.cause)
	}
	if deliveries < 5 {
		t.Errorf("only %d competing deliveries were tried", deliveries)
	}
	if got := b.effects(t, ev.Key); len(got) != 1 || got[0] != "long" {
		t.Errorf("effects = %v, want the long handler's only", got)
	}
	if r := b.row(t, ev.Key); r.Attempts != 1 {
		t.Errorf("attempts = %d, want 1: the claim was never taken over", r.Attempts)
	}
	b.api.wantCalls(t, txhook.IdempotencyKey("test", ev.Key, "charge"), 1)
}

// TestLeaseEndsWorkWhenRenewalsFail: while no renewal succeeds (here each
// waits, until the lease's end, on a row lock another session holds), the
// work's context ends with ErrLeaseLost when the lease runs out, so that a
// worker cut off from its claim stops before another delivery may take the
// event over.
func TestLeaseEndsWorkWhenRenewalsFail(t *testing.T) {
	t.Parallel()
	b := leaseSetup(t)
	ev := leaseEvent("evt_renewals_fail")
	const lease = time.Second
	claimed, ended, done := make(chan struct{}), make(chan error, 1), make(chan error, 1)
	go func() {
		_, err := b.p.ProcessLease(t.Context(), ev, txhook.LeaseHandler{Lease: lease, RenewEvery: 100 * time.Millisecond,
			Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
				close(claimed)
				<-ctx.Done()
				ended <- context.Cause(ctx)
				return nil, context.Cause(ctx)
			}})
		done <- err
	}()
	select {
	case <-claimed:
	case err := <-done:
		t.Fatalf("the delivery ended before its work: %v", err)
	case <-time.After(waitBound):
		t.Fatal("the delivery did not claim the event")
	}
	tx, err := b.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(t.Context(), `SELECT 1 FROM txhook_processed_events
		WHERE source = 'test' AND event_key = $1 FOR UPDATE`, ev.Key); err != nil {
		t.Fatal(err)
	}
	select {
	case cause := <-ended:
		if !errors.Is(cause, txhook.ErrLeaseLost) {
			t.Errorf("work's context ended with %v, want ErrLeaseLost", cause)
		}
	case <-time.After(lease + 2*time.Second):
		t.Fatalf("work's context did not end when its %v lease ran out without a renewal", lease)
	}
	if err := tx.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, txhook.ErrLeaseLost) {
			t.Errorf("delivery = %v, want an error matching ErrLeaseLost", err)
		}
	case <-time.After(waitBound):
		t.Fatal("the delivery did not end after its work")
	}
	b.mustLease(t, ev, txhook.LeaseHandler{Work: b.chargeAndRecord("next")}, txhook.OutcomeProcessed)
}

// TestLeaseRenewalFencedByToken: once another claim replaces a worker's
// (simulated here by bumping the token as a claim does), the worker's next
// renewal finds its token gone, its context ends with ErrLeaseLost, and
// nothing of its phase two commits.
func TestLeaseRenewalFencedByToken(t *testing.T) {
	t.Parallel()
	b := leaseSetup(t)
	ev := leaseEvent("evt_renew_fenced")
	w := b.startBlocked(t, ev, txhook.LeaseHandler{Lease: 10 * time.Second, RenewEvery: 50 * time.Millisecond, Work: b.chargeAndRecord("old")}, true)
	w.claim(t)
	if _, err := b.pool.Exec(t.Context(), `UPDATE txhook_processed_events
		SET attempts = attempts + 1, claimed_at = clock_timestamp(), lease_expires_at = clock_timestamp() + interval '1 minute'
		WHERE source = 'test' AND event_key = $1`, ev.Key); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.done:
	case <-time.After(renewalNotice):
		t.Fatalf("worker's context did not end within %v of its claim being replaced: no renewal noticed (the lease's end, at 10s, would stop it)", renewalNotice)
	}
	if !errors.Is(w.cause, txhook.ErrLeaseLost) {
		t.Errorf("context cause = %v, want ErrLeaseLost", w.cause)
	}
	if !errors.Is(w.err, txhook.ErrLeaseLost) {
		t.Errorf("worker = %v, %v; want ErrLeaseLost", w.res, w.err)
	}
	if got := b.effects(t, ev.Key); len(got) != 0 {
		t.Errorf("effects = %v, want none", got)
	}
	if r := b.row(t, ev.Key); r.Status != "in_progress" || r.Attempts != 2 {
		t.Errorf("row = %+v, want the replacing claim untouched", r)
	}
}

func TestLeaseHandlerErrorReleasesAtOnce(t *testing.T) {
	t.Parallel()
	for _, phase := range []string{"work", "commit"} {
		t.Run(phase, func(t *testing.T) {
			t.Parallel()
			b := leaseSetup(t)
			ev := leaseEvent("evt_release_" + phase)
			errUpstream := errors.New("upstream answered 502")
			const lease = time.Hour // a retry must not wait for it
			failing := txhook.LeaseHandler{Lease: lease, Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
				if err := b.api.charge(ctx, c.IdempotencyKey("charge")); err != nil {
					return nil, err
				}
				if phase == "work" {
					return nil, errUpstream
				}
				return func(ctx context.Context, tx pgx.Tx) error {
					if err := recordEffect(ev.Key, "failing")(ctx, tx); err != nil {
						return err
					}
					return errUpstream
				}, nil
			}}
			_, err := b.p.ProcessLease(t.Context(), ev, failing)
			if !errors.Is(err, errUpstream) || errors.Is(err, txhook.ErrLeaseLost) {
				t.Fatalf("error = %v, want the handler's error", err)
			}
			r := b.row(t, ev.Key)
			if r.Status != "in_progress" || r.Attempts != 1 || !strings.Contains(r.LastError.String, "upstream answered 502") {
				t.Errorf("row = %+v, want released attempt 1 with the last error", r)
			}
			if got := b.effects(t, ev.Key); len(got) != 0 {
				t.Errorf("effects = %v after an error, want none", got)
			}

			var token int
			b.mustLease(t, ev, txhook.LeaseHandler{Lease: lease, Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
				token = c.Token
				return b.chargeAndRecord("retry")(ctx, c, ev)
			}}, txhook.OutcomeProcessed)
			if token != 2 {
				t.Errorf("retry's token = %d, want 2", token)
			}
			if r := b.row(t, ev.Key); r.Status != "done" || r.Attempts != 2 {
				t.Errorf("row = %+v, want done by attempt 2", r)
			}
			if got := b.effects(t, ev.Key); len(got) != 1 || got[0] != "retry" {
				t.Errorf("effects = %v, want the retry's only", got)
			}
			b.api.wantCalls(t, txhook.IdempotencyKey("test", ev.Key, "charge"), 2)
		})
	}
}

func TestLeasePermanentErrorFailsAndReplays(t *testing.T) {
	t.Parallel()
	b := leaseSetup(t)
	ev := leaseEvent("evt_permanent")
	errUnknown := errors.New("unknown account acct_9")
	res := b.mustLease(t, ev, txhook.LeaseHandler{Work: func(context.Context, txhook.Claim, txhook.Event) (txhook.TxFunc, error) {
		return nil, txhook.Permanent(errUnknown)
	}}, txhook.OutcomeFailed)
	if !errors.Is(res.Err, errUnknown) || !txhook.IsPermanent(res.Err) {
		t.Errorf("Result.Err = %v, want the permanent error", res.Err)
	}
	r := b.row(t, ev.Key)
	if r.Status != "failed" || !strings.Contains(r.LastError.String, "unknown account acct_9") || !r.CompletedAt.Valid || r.LeaseExpiresAt.Valid {
		t.Errorf("row = %+v, want failed with the error", r)
	}

	// Redeliveries, in either mode, are duplicates: the sender was answered
	// 2xx and an operator decides.
	good := txhook.LeaseHandler{Work: b.chargeAndRecord("replay")}
	b.mustLease(t, ev, good, txhook.OutcomeDuplicate)
	tres, err := b.p.Process(t.Context(), ev, func(context.Context, pgx.Tx, txhook.Event) error { return nil })
	if err != nil || tres.Outcome != txhook.OutcomeDuplicate {
		t.Errorf("transactional redelivery = %v, %v; want duplicate", tres, err)
	}
	if got := b.api.snapshot(); len(got) != 0 {
		t.Errorf("external calls = %v before replay", got)
	}

	// The operator's replay, from the stored payload, runs it once through
	// the event's route.
	rs := txhook.NewRoutes()
	rs.Lease(ev.Source, ev.Type, good)
	replayer, err := txhook.NewProcessor(b.pool, &txhook.Config{Routes: rs})
	if err != nil {
		t.Fatal(err)
	}
	res, err = replayer.Replay(t.Context(), ev.Source, ev.Key)
	if err != nil || res.Outcome != txhook.OutcomeProcessed {
		t.Fatalf("replay = %v, %v; want processed", res, err)
	}
	res, err = replayer.Replay(t.Context(), ev.Source, ev.Key)
	if err != nil || res.Outcome != txhook.OutcomeDuplicate {
		t.Errorf("second replay = %v, %v; want duplicate", res, err)
	}
	if r := b.row(t, ev.Key); r.Status != "done" || r.Attempts != 2 {
		t.Errorf("row = %+v, want done by attempt 2", r)
	}
	if got := b.effects(t, ev.Key); len(got) != 1 {
		t.Errorf("effects = %v, want one", got)
	}
	b.api.wantCalls(t, txhook.IdempotencyKey("test", ev.Key, "charge"), 1)
}

func TestLeasePermanentErrorInCommitRollsBack(t *testing.T) {
	t.Parallel()
	b := leaseSetup(t)
	ev := leaseEvent("evt_permanent_commit")
	res := b.mustLease(t, ev, txhook.LeaseHandler{Work: func(context.Context, txhook.Claim, txhook.Event) (txhook.TxFunc, error) {
		return func(ctx context.Context, tx pgx.Tx) error {
			if err := recordEffect(ev.Key, "rejected")(ctx, tx); err != nil {
				return err
			}
			return txhook.Permanent(errors.New("invoice already void"))
		}, nil
	}}, txhook.OutcomeFailed)
	if !txhook.IsPermanent(res.Err) {
		t.Errorf("Result.Err = %v, want permanent", res.Err)
	}
	if got := b.effects(t, ev.Key); len(got) != 0 {
		t.Errorf("effects = %v, want the failed commit's writes rolled back", got)
	}
	if r := b.row(t, ev.Key); r.Status != "failed" {
		t.Errorf("status = %s, want failed", r.Status)
	}
}

func TestLeaseRejectsBadInput(t *testing.T) {
	t.Parallel()
	b := leaseSetup(t)
	work := b.chargeAndRecord("w")
	for _, tc := range []struct {
		name string
		ev   txhook.Event
		h    txhook.LeaseHandler
	}{
		{"nil work", leaseEvent("k1"), txhook.LeaseHandler{}},
		{"negative lease", leaseEvent("k2"), txhook.LeaseHandler{Work: work, Lease: -time.Second}},
		{"sub-millisecond lease", leaseEvent("k3"), txhook.LeaseHandler{Work: work, Lease: time.Microsecond}},
		{"renewal not shorter than lease", leaseEvent("k4"), txhook.LeaseHandler{Work: work, Lease: time.Second, RenewEvery: time.Second}},
		{"empty key", leaseEvent(""), txhook.LeaseHandler{Work: work}},
		{"NUL in key", leaseEvent("a\x00b"), txhook.LeaseHandler{Work: work}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := b.p.ProcessLease(t.Context(), tc.ev, tc.h)
			if err == nil {
				t.Fatalf("ProcessLease = %v, want an error", res)
			}
		})
	}
	if _, err := b.p.ProcessLease(t.Context(), leaseEvent(""), txhook.LeaseHandler{Work: work}); !errors.Is(err, txhook.ErrInvalidEvent) {
		t.Errorf("empty key error = %v, want ErrInvalidEvent", err)
	}
	var n int
	if err := b.pool.QueryRow(t.Context(), "SELECT count(*) FROM txhook_processed_events").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d rows written for rejected input", n)
	}
	if got := b.api.snapshot(); len(got) != 0 {
		t.Errorf("external calls = %v for rejected input", got)
	}
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	k := txhook.IdempotencyKey("stripe", "evt_1", "charge")
	if k != txhook.IdempotencyKey("stripe", "evt_1", "charge") {
		t.Error("key is not deterministic")
	}
	if !strings.HasPrefix(k, "txh_") || len(k) != 68 || strings.Trim(k[4:], "0123456789abcdef") != "" {
		t.Errorf("key %q, want txh_ and 64 lowercase hex digits", k)
	}
	if c := (txhook.Claim{Source: "stripe", Key: "evt_1", Token: 7}); c.IdempotencyKey("charge") != k {
		t.Error("Claim.IdempotencyKey differs from IdempotencyKey or depends on the token")
	}
	seen := map[string][3]string{}
	for _, in := range [][3]string{
		{"stripe", "evt_1", "charge"},
		{"github", "evt_1", "charge"},
		{"stripe", "evt_2", "charge"},
		{"stripe", "evt_1", "email"},
		{"stripe", "evt_1", ""},
		{"stripeevt_1", "", "charge"},
		{"stripe", "evt_1charge", ""},
		{"", "stripe", "evt_1charge"},
	} {
		k := txhook.IdempotencyKey(in[0], in[1], in[2])
		if prev, ok := seen[k]; ok {
			t.Errorf("%q and %q share key %s", prev, in, k)
		}
		seen[k] = in
	}
}

// TestLeaseLateCompletionWithoutTakeover: fencing is by token, not by clock.
// A worker that overran its lease while no other delivery claimed the event
// still holds the newest claim, and its completion commits.
func TestLeaseLateCompletionWithoutTakeover(t *testing.T) {
	t.Parallel()
	b := leaseSetup(t)
	ev := leaseEvent("evt_late")
	var cause error
	b.mustLease(t, ev, txhook.LeaseHandler{Lease: 100 * time.Millisecond, RenewEvery: -1,
		Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
			deadline, ok := ctx.Deadline()
			if !ok || time.Until(deadline) > 100*time.Millisecond {
				return nil, fmt.Errorf("work context deadline %v (set: %v), want within the lease", deadline, ok)
			}
			<-ctx.Done()
			cause = context.Cause(ctx)
			return recordEffect(ev.Key, "late"), nil
		}}, txhook.OutcomeProcessed)
	if !errors.Is(cause, txhook.ErrLeaseLost) {
		t.Errorf("context cause = %v, want ErrLeaseLost at the end of the lease", cause)
	}
	if got := b.effects(t, ev.Key); len(got) != 1 {
		t.Errorf("effects = %v, want one", got)
	}
}

func TestLeaseWithoutPhaseTwoMarksDone(t *testing.T) {
	t.Parallel()
	b := leaseSetup(t)
	ev := leaseEvent("evt_nocommit")
	b.mustLease(t, ev, txhook.LeaseHandler{Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
		return nil, b.api.charge(ctx, c.IdempotencyKey("notify"))
	}}, txhook.OutcomeProcessed)
	if r := b.row(t, ev.Key); r.Status != "done" {
		t.Errorf("status = %s, want done", r.Status)
	}
	b.api.wantCalls(t, txhook.IdempotencyKey("test", ev.Key, "notify"), 1)
}

// TestLeasePanicReleasesClaim: a panicking handler (in either phase) panics
// on to the caller, rolls back its writes and releases its claim at once.
func TestLeasePanicReleasesClaim(t *testing.T) {
	t.Parallel()
	for _, phase := range []string{"work", "commit"} {
		t.Run(phase, func(t *testing.T) {
			t.Parallel()
			b := leaseSetup(t)
			ev := leaseEvent("evt_panic_" + phase)
			h := txhook.LeaseHandler{Lease: time.Hour, Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
				if phase == "work" {
					panic("boom")
				}
				return func(ctx context.Context, tx pgx.Tx) error {
					if err := recordEffect(ev.Key, "panicked")(ctx, tx); err != nil {
						return err
					}
					panic("boom")
				}, nil
			}}
			func() {
				defer func() {
					if v := recover(); v != "boom" {
						t.Errorf("recovered %v, want the handler's panic", v)
					}
				}()
				b.p.ProcessLease(t.Context(), ev, h)
			}()
			if r := b.row(t, ev.Key); r.Status != "in_progress" || !strings.Contains(r.LastError.String, "panicked: boom") {
				t.Errorf("row = %+v, want released with the panic recorded", r)
			}
			b.mustLease(t, ev, txhook.LeaseHandler{Lease: time.Hour, Work: b.chargeAndRecord("retry")}, txhook.OutcomeProcessed)
			if got := b.effects(t, ev.Key); len(got) != 1 || got[0] != "retry" {
				t.Errorf("effects = %v, want the retry's only", got)
			}
		})
	}
}

// TestLeaseNoTakeoverDuringPhaseTwo: phase two marks the row done first,
// which locks it; a delivery arriving after the lease ended but before COMMIT
// waits for that lock instead of taking over, and then finds the event done.
func TestLeaseNoTakeoverDuringPhaseTwo(t *testing.T) {
	t.Parallel()
	b := leaseSetup(t)
	ev := leaseEvent("evt_phase_two")
	var other txhook.Result
	var otherErr error
	otherDone := make(chan struct{})
	h := txhook.LeaseHandler{Lease: 200 * time.Millisecond, RenewEvery: -1, Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
		if err := b.api.charge(ctx, c.IdempotencyKey("charge")); err != nil {
			return nil, err
		}
		return func(ctx context.Context, tx pgx.Tx) error {
			if err := recordEffect(ev.Key, "first")(ctx, tx); err != nil {
				return err
			}
			// Let the lease run out as seen by other connections.
			until(t, "lease end", func() bool {
				var ended bool
				err := b.pool.QueryRow(ctx, `SELECT lease_expires_at < clock_timestamp() FROM txhook_processed_events
					WHERE source = 'test' AND event_key = $1`, ev.Key).Scan(&ended)
				return err == nil && ended
			})
			go func() {
				defer close(otherDone)
				other, otherErr = b.p.ProcessLease(t.Context(), ev, txhook.LeaseHandler{Work: b.chargeAndRecord("second")})
			}()
			until(t, "the second delivery to wait for the row lock", func() bool {
				var n int
				err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
				return err == nil && n > 0
			})
			return nil
		}, nil
	}}
	b.mustLease(t, ev, h, txhook.OutcomeProcessed)
	select {
	case <-otherDone:
	case <-time.After(waitBound):
		t.Fatal("the delivery during phase two did not end")
	}
	if otherErr != nil || other.Outcome != txhook.OutcomeDuplicate {
		t.Errorf("delivery during phase two = %v, %v; want duplicate", other, otherErr)
	}
	if got := b.effects(t, ev.Key); len(got) != 1 || got[0] != "first" {
		t.Errorf("effects = %v, want the first delivery's only", got)
	}
	b.api.wantCalls(t, txhook.IdempotencyKey("test", ev.Key, "charge"), 1)
}
