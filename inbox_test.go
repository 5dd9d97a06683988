package txhook_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/internal/pgtrace"
)

// jobQueue is a stand-in for a job queue (River itself is tested in package
// inbox): Enqueue inserts a row into the jobs table, in the accepting
// transaction.
type jobQueue struct {
	// query inserts through Query, as River's InsertTx does: a multi-row
	// query, which the engine's first batch must carry too.
	query bool
	// fail, when set, is Enqueue's error.
	fail error
	// hold, when set, is the key whose Enqueue waits, after its insert,
	// until release is closed, keeping its transaction open (and the
	// body dedupe's lock, taken before it, held).
	hold    string
	held    chan struct{} // closed once the held Enqueue waits
	release chan struct{}
}

func (q *jobQueue) Enqueue(ctx context.Context, tx pgx.Tx, ev txhook.Event) (int64, error) {
	if q.fail != nil {
		return 0, q.fail
	}
	var id int64
	if q.query {
		rows, err := tx.Query(ctx, `INSERT INTO jobs (key) VALUES ($1) RETURNING id`, ev.Key)
		if err != nil {
			return 0, err
		}
		if id, err = pgx.CollectExactlyOneRow(rows, pgx.RowTo[int64]); err != nil {
			return 0, err
		}
	} else if err := tx.QueryRow(ctx, `INSERT INTO jobs (key) VALUES ($1) RETURNING id`, ev.Key).Scan(&id); err != nil {
		return 0, err
	}
	if q.hold == ev.Key {
		close(q.held)
		<-q.release
	}
	return id, nil
}

// inbox returns a Processor whose source "test" has one route, its
// fallback, in inbox mode with h, on the queue q (and makes the jobs table
// q writes to).
func (b *bundle) inbox(t *testing.T, cfg *txhook.Config, h txhook.HandlerFunc, q txhook.Queue) *txhook.Processor {
	t.Helper()
	return b.inboxOn(t, b.pool, cfg, h, q)
}

// inboxOn is inbox on the database d.
func (b *bundle) inboxOn(t *testing.T, d txhook.Beginner, cfg *txhook.Config, h txhook.HandlerFunc, q txhook.Queue) *txhook.Processor {
	t.Helper()
	if _, err := b.pool.Exec(t.Context(), `CREATE TABLE jobs (id bigserial PRIMARY KEY, key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var c txhook.Config
	if cfg != nil {
		c = *cfg
	}
	c.Routes = txhook.NewRoutes()
	c.Routes.Inbox("test", "", h)
	p, err := txhook.NewProcessor(d, &c)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.UseQueue(q); err != nil {
		t.Fatal(err)
	}
	if err := p.UseQueue(q); err == nil {
		t.Fatal("a second UseQueue succeeded")
	}
	return p
}

// accept delivers ev to p's inbox route.
func accept(t *testing.T, p *txhook.Processor, ev txhook.Event, g *txhook.BodyDedupe) (txhook.Result, error) {
	t.Helper()
	return p.Deliver(boundedCtx(t), ev, &txhook.DeliverOptions{BodyDedupe: g})
}

func TestAcceptRecordsQueuedEventAndJobOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.inbox(t, nil, insertEffect, &jobQueue{})
	ev := event("a-1")
	res, err := accept(t, p, ev, nil)
	if err != nil || res.Outcome != txhook.OutcomeQueued {
		t.Fatalf("Accept = %v, %v; want queued", res.Outcome, err)
	}
	rec, err := txhook.GetEventRecord(t.Context(), b.pool, "test", "a-1")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != txhook.StatusQueued || rec.JobID == 0 || string(rec.Payload) != string(ev.Payload) || !rec.CompletedAt.IsZero() {
		t.Fatalf("record = %+v: want queued, with its job and payload (StorePayload off notwithstanding)", rec)
	}
	for _, want := range []txhook.Outcome{txhook.OutcomeDuplicate, txhook.OutcomeDuplicate} {
		res, err := accept(t, p, ev, nil)
		if err != nil || res.Outcome != want {
			t.Fatalf("redelivery: Accept = %v, %v; want %v", res.Outcome, err, want)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM jobs`); n != 1 {
		t.Fatalf("%d jobs, want 1", n)
	}
	// Settled, the key is still a duplicate and enqueues nothing.
	if res, err := p.ApplyQueued(t.Context(), txhook.QueuedJob{Source: "test", Key: "a-1"}); err != nil || res.Outcome != txhook.OutcomeProcessed {
		t.Fatalf("ApplyQueued = %v, %v; want processed", res.Outcome, err)
	}
	if n := b.effects(t, "a-1"); n != 1 {
		t.Fatalf("effects = %d after the apply, want 1", n)
	}
	if res, err := accept(t, p, ev, nil); err != nil || res.Outcome != txhook.OutcomeDuplicate {
		t.Fatalf("Accept after done = %v, %v; want duplicate", res.Outcome, err)
	}
	if n := b.count(t, `SELECT count(*) FROM jobs`); n != 1 {
		t.Fatalf("%d jobs after a redelivery of the done key, want 1", n)
	}
}

// TestAcceptDuplicateInsertsNoJob: a redelivery of a recorded key, queued or
// settled, with or without body dedupe, is answered before its job's
// insert runs: the jobs table's sequence, which a rolled-back insert would
// still advance, does not move.
func TestAcceptDuplicateInsertsNoJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.inbox(t, nil, insertEffect, &jobQueue{query: true})
	g := &txhook.BodyDedupe{}
	hashed := event("a-2")
	hashed.PayloadHash = []byte("h-2")
	for _, ev := range []txhook.Event{event("a-1"), hashed} {
		guard := g
		if len(ev.PayloadHash) == 0 {
			guard = nil
		}
		if res, err := accept(t, p, ev, guard); err != nil || res.Outcome != txhook.OutcomeQueued {
			t.Fatalf("%s: Accept = %v, %v; want queued", ev.Key, res.Outcome, err)
		}
		seq := b.count(t, `SELECT last_value FROM jobs_id_seq`)
		for _, state := range []string{"queued", "done"} {
			if state == "done" {
				if res, err := p.ApplyQueued(t.Context(), txhook.QueuedJob{Source: "test", Key: ev.Key}); err != nil || res.Outcome != txhook.OutcomeProcessed {
					t.Fatalf("%s: ApplyQueued = %v, %v; want processed", ev.Key, res.Outcome, err)
				}
			}
			res, err := accept(t, p, ev, guard)
			if err != nil || res.Outcome != txhook.OutcomeDuplicate {
				t.Fatalf("%s %s: redelivery: Accept = %v, %v; want duplicate", ev.Key, state, res.Outcome, err)
			}
			if got := b.count(t, `SELECT last_value FROM jobs_id_seq`); got != seq {
				t.Errorf("%s %s: the jobs sequence moved from %d to %d: the redelivery's job insert ran", ev.Key, state, seq, got)
			}
		}
	}
}

// TestAcceptTwoRoundTrips checks the accept's statements: the key's check
// and the job's insert travel with BEGIN and the row's insert, with the
// job's id, with COMMIT. A duplicate is answered by the check, in the first
// round trip (the server skips the job's insert after it), then ROLLBACK.
func TestAcceptTwoRoundTrips(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, tr := pgtrace.Pool(t, b.db.URL)
	p := b.inboxOn(t, pool, nil, insertEffect, &jobQueue{query: true})
	// The first call on a connection also prepares the statements.
	if res, err := accept(t, p, event("a-warm"), nil); err != nil || res.Outcome != txhook.OutcomeQueued {
		t.Fatalf("warm-up Accept = %v, %v; want queued", res.Outcome, err)
	}
	tr.Take()
	insertJob := "insert into jobs (key) values ($1) returning id"
	for _, c := range []struct {
		name string
		want txhook.Outcome
		sent [][]string
	}{
		{"new", txhook.OutcomeQueued, [][]string{{"begin", "CheckKeyNotRecorded", insertJob}, {"QueueEventWithJob", "commit"}}},
		{"duplicate", txhook.OutcomeDuplicate, [][]string{{"begin", "CheckKeyNotRecorded", insertJob}, {"rollback"}}},
	} {
		res, err := accept(t, p, event("a-1"), nil)
		if err != nil || res.Outcome != c.want {
			t.Fatalf("%s: Accept = %v, %v; want %v", c.name, res.Outcome, err, c.want)
		}
		if got := tr.Take(); !slices.EqualFunc(got, c.sent, slices.Equal) {
			t.Errorf("%s: round trips %q, want %q", c.name, got, c.sent)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM jobs WHERE key = 'a-1'`); n != 1 {
		t.Errorf("%d jobs for the key after a duplicate, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM txhook_processed_events e JOIN jobs j ON j.id = e.job_id WHERE e.event_key = 'a-1'`); n != 1 {
		t.Errorf("%d rows for the key with its job's id, want 1", n)
	}
}

// TestAcceptWithBodyDedupeTwoRoundTrips: with body dedupe, its check
// travels with the key's, ahead of the job's insert, so the accept keeps
// its two round trips; a replayed body under a new key fails the check in
// the first, and the server skips the job's insert after it.
func TestAcceptWithBodyDedupeTwoRoundTrips(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, tr := pgtrace.Pool(t, b.db.URL)
	p := b.inboxOn(t, pool, nil, insertEffect, &jobQueue{query: true})
	g := &txhook.BodyDedupe{}
	if res, err := accept(t, p, withHash("a-warm", "h-warm"), g); err != nil || res.Outcome != txhook.OutcomeQueued {
		t.Fatalf("warm-up Accept = %v, %v; want queued", res.Outcome, err)
	}
	tr.Take()
	first := []string{"begin isolation level read committed", "CheckKeyNotRecorded", "CheckBodyNotRecorded", "insert into jobs (key) values ($1) returning id"}
	if res, err := accept(t, p, withHash("a-1", "h-1"), g); err != nil || res.Outcome != txhook.OutcomeQueued {
		t.Fatalf("Accept = %v, %v; want queued", res.Outcome, err)
	}
	if got, want := tr.Take(), [][]string{first, {"QueueEventWithJob", "commit"}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("new: round trips %q, want %q", got, want)
	}
	seq := b.count(t, `SELECT last_value FROM jobs_id_seq`)
	if _, err := accept(t, p, withHash("a-2", "h-1"), g); !isReplayOf(err, "a-1") {
		t.Fatalf("same body, new key: Accept error = %v, want a replay of a-1", err)
	}
	if got, want := tr.Take(), [][]string{first, {"rollback"}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("replay: round trips %q, want %q", got, want)
	}
	if got := b.count(t, `SELECT last_value FROM jobs_id_seq`); got != seq {
		t.Errorf("the jobs sequence moved from %d to %d: the replay's job insert ran", seq, got)
	}
}

// TestAcceptWithBodyDedupe: the guard's check runs before the row's insert,
// which travels with COMMIT while the guard's lock is still held: a body
// accepted under one key is a replay under another, also when the two
// deliveries overlap, and nothing of the replay is written.
func TestAcceptWithBodyDedupe(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q := &jobQueue{query: true, hold: "k-3", held: make(chan struct{}), release: make(chan struct{})}
	p := b.inbox(t, nil, insertEffect, q)
	g := &txhook.BodyDedupe{LockTimeout: 100 * time.Millisecond}
	accept := func(ev txhook.Event) (txhook.Result, error) { return accept(t, p, ev, g) }
	if res, err := accept(withHash("k-1", "h-1")); err != nil || res.Outcome != txhook.OutcomeQueued {
		t.Fatalf("Accept = %v, %v; want queued", res.Outcome, err)
	}
	if res, err := accept(withHash("k-1", "h-1")); err != nil || res.Outcome != txhook.OutcomeDuplicate {
		t.Fatalf("redelivery: Accept = %v, %v; want duplicate", res.Outcome, err)
	}
	if _, err := accept(withHash("k-2", "h-1")); !isReplayOf(err, "k-1") {
		t.Fatalf("same body, new key: Accept error = %v, want a replay of k-1", err)
	}

	// Overlapping: the first delivery's transaction holds the guard's lock
	// while the second checks.
	first := make(chan error, 1)
	go func() {
		res, err := accept(withHash("k-3", "h-3"))
		if err == nil && res.Outcome != txhook.OutcomeQueued {
			err = fmt.Errorf("outcome %v, want queued", res.Outcome)
		}
		first <- err
	}()
	select {
	case <-q.held:
	case <-time.After(waitBound):
		t.Fatal("the first delivery did not reach its enqueue")
	}
	if res, err := accept(withHash("k-4", "h-3")); err != nil || res.Outcome != txhook.OutcomeInFlight {
		t.Fatalf("while the first holds the lock: Accept = %v, %v; want in flight", res.Outcome, err)
	}
	close(q.release)
	if err := <-first; err != nil {
		t.Fatalf("the first delivery: %v", err)
	}
	if _, err := accept(withHash("k-4", "h-3")); !isReplayOf(err, "k-3") {
		t.Fatalf("after the first committed: Accept error = %v, want a replay of k-3", err)
	}
	if n := b.count(t, `SELECT count(*) FROM jobs`); n != 2 {
		t.Errorf("%d jobs, want 2 (k-1 and k-3)", n)
	}
	if n := b.keys(t); n != 2 {
		t.Errorf("%d event rows, want 2 (k-1 and k-3)", n)
	}
}

// withHash is event(key) with hash as its PayloadHash, for body dedupe.
func withHash(key, hash string) txhook.Event {
	ev := event(key)
	ev.PayloadHash = []byte(hash)
	return ev
}

func isReplayOf(err error, key string) bool {
	re, ok := errors.AsType[*txhook.DuplicateBodyError](err)
	return ok && re.Key == key
}

func TestAcceptRollsBackWhenEnqueueFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	boom := errors.New("queue full")
	p := b.inbox(t, nil, insertEffect, &jobQueue{fail: boom})
	_, err := accept(t, p, event("a-1"), nil)
	if !errors.Is(err, boom) {
		t.Fatalf("Accept = %v, want the enqueue error", err)
	}
	if n := b.keys(t); n != 0 {
		t.Fatalf("%d event rows after a failed enqueue, want 0: nothing is accepted without its job", n)
	}
}

func TestAcceptInFlightWhileAnotherHoldsTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.inbox(t, &txhook.Config{LockTimeout: 100 * time.Millisecond}, insertEffect, &jobQueue{})
	// Another delivery holds the key: its row is inserted, not committed.
	tx := holdRow(t, b.pool, `INSERT INTO txhook_processed_events (source, event_key, status) VALUES ('test', 'a-1', 'queued')`)
	res, err := accept(t, p, event("a-1"), nil)
	if err != nil || res.Outcome != txhook.OutcomeInFlight || res.RetryAfter <= 0 {
		t.Fatalf("concurrent Accept = %+v, %v; want in flight with a retry hint", res, err)
	}
	if err := tx.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := b.keys(t); n != 0 {
		t.Fatalf("%d rows after the caller rolled back, want 0", n)
	}
}

// A concurrent delivery of the key that commits while the accept's insert
// waits for it makes the accept a duplicate: its job rolls back with it.
func TestAcceptDuplicateOfAConcurrentDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.inbox(t, nil, insertEffect, &jobQueue{})
	tx := holdRow(t, b.pool, `INSERT INTO txhook_processed_events (source, event_key, status) VALUES ('test', 'a-1', 'queued')`)
	done := inBackground(func() (txhook.Result, error) { return accept(t, p, event("a-1"), nil) })
	waitForLockWaiter(t, b.pool)
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	a := <-done
	if a.err != nil || a.res.Outcome != txhook.OutcomeDuplicate {
		t.Fatalf("Accept after the concurrent delivery committed = %+v, %v; want duplicate", a.res, a.err)
	}
	if n := b.count(t, `SELECT count(*) FROM jobs`); n != 0 {
		t.Fatalf("%d jobs, want none: the duplicate's job rolls back", n)
	}
}

func TestApplyQueuedSettledRunsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ran := false
	h := func(context.Context, pgx.Tx, txhook.Event) error { ran = true; return nil }
	p := b.inbox(t, nil, h, &jobQueue{})
	mustProcess(t, p, event("a-1"), insertEffect, txhook.OutcomeProcessed)
	for _, key := range []string{"a-1", "gone"} {
		res, err := p.ApplyQueued(t.Context(), txhook.QueuedJob{Source: "test", Key: key})
		if err != nil || res.Outcome != txhook.OutcomeDuplicate {
			t.Fatalf("ApplyQueued(%s) = %v, %v; want duplicate", key, res.Outcome, err)
		}
	}
	if ran {
		t.Fatal("the handler ran for a settled or missing event")
	}
	if n := b.effects(t, "a-1"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

func TestApplyQueuedErrorKeepsEventQueued(t *testing.T) {
	t.Parallel()
	b := setup(t)
	failing := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		if err := insertEffect(ctx, tx, ev); err != nil {
			return err
		}
		return errors.New("try again")
	}
	p := b.inbox(t, nil, failing, &jobQueue{})
	if _, err := accept(t, p, event("a-1"), nil); err != nil {
		t.Fatal(err)
	}
	j := txhook.QueuedJob{Source: "test", Key: "a-1"}
	if _, err := p.ApplyQueued(t.Context(), j); err == nil {
		t.Fatal("ApplyQueued with a failing handler returned nil")
	}
	rec, err := txhook.GetEventRecord(t.Context(), b.pool, "test", "a-1")
	if err != nil || rec.Status != txhook.StatusQueued || rec.Attempts != 2 || rec.LastError == "" {
		t.Fatalf("record = %+v, %v; want still queued, one failed try recorded", rec, err)
	}
	if n := b.effects(t, "a-1") + b.count(t, `SELECT count(*) FROM jobs`); n != 1 {
		t.Fatalf("effects + jobs = %d: want the handler's write rolled back and the job kept", n)
	}
	j.LastAttempt = true
	res, err := p.ApplyQueued(t.Context(), j)
	if err != nil || res.Outcome != txhook.OutcomeFailed || res.Err == nil {
		t.Fatalf("last attempt = %+v, %v; want failed", res, err)
	}
	rec, err = txhook.GetEventRecord(t.Context(), b.pool, "test", "a-1")
	if err != nil || rec.Status != txhook.StatusFailed || !rec.HasPayload {
		t.Fatalf("record = %+v, %v; want failed with its payload (a dead letter)", rec, err)
	}
}
