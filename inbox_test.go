package txhook_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
)

// jobsTable makes a stand-in for a job queue's table: Accept's enqueue inserts into
// it in the accepting transaction, and Complete deletes from it in the
// applying one.
func (b *bundle) jobsTable(t *testing.T) {
	t.Helper()
	if _, err := b.pool.Exec(t.Context(), `CREATE TABLE jobs (id bigserial PRIMARY KEY, key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
}

func enqueueJob(ctx context.Context, tx pgx.Tx, ev txhook.Event) (int64, error) {
	var id int64
	err := tx.QueryRow(ctx, `INSERT INTO jobs (key) VALUES ($1) RETURNING id`, ev.Key).Scan(&id)
	return id, err
}

func completeJob(key string) func(context.Context, pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `DELETE FROM jobs WHERE key = $1`, key)
		return err
	}
}

func TestAcceptRecordsQueuedEventAndJobOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.jobsTable(t)
	p := b.processor(t, nil)
	ev := event("a-1")
	res, err := p.Accept(t.Context(), ev, nil, enqueueJob)
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
		res, err := p.Accept(t.Context(), ev, nil, enqueueJob)
		if err != nil || res.Outcome != want {
			t.Fatalf("redelivery: Accept = %v, %v; want %v", res.Outcome, err, want)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM jobs`); n != 1 {
		t.Fatalf("%d jobs, want 1", n)
	}
	// Settled, the key is still a duplicate and enqueues nothing.
	if res, err := p.ApplyQueued(t.Context(), txhook.QueuedJob{Source: "test", Key: "a-1", Complete: completeJob("a-1")}, insertEffect); err != nil || res.Outcome != txhook.OutcomeProcessed {
		t.Fatalf("ApplyQueued = %v, %v; want processed", res.Outcome, err)
	}
	if res, err := p.Accept(t.Context(), ev, nil, enqueueJob); err != nil || res.Outcome != txhook.OutcomeDuplicate {
		t.Fatalf("Accept after done = %v, %v; want duplicate", res.Outcome, err)
	}
	if n := b.count(t, `SELECT count(*) FROM jobs`); n != 0 {
		t.Fatalf("%d jobs after the apply completed its job, want 0", n)
	}
}

// TestAcceptDuplicateInsertsNoJob: a redelivery of a recorded key, queued or
// settled, with or without the replay guard, is answered before its job's
// insert runs: the jobs table's sequence, which a rolled-back insert would
// still advance, does not move.
func TestAcceptDuplicateInsertsNoJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.jobsTable(t)
	p := b.processor(t, nil)
	g := &txhook.ReplayGuard{}
	hashed := event("a-2")
	hashed.PayloadHash = []byte("h-2")
	for _, ev := range []txhook.Event{event("a-1"), hashed} {
		guard := g
		if len(ev.PayloadHash) == 0 {
			guard = nil
		}
		if res, err := p.Accept(t.Context(), ev, guard, enqueueJobQuery); err != nil || res.Outcome != txhook.OutcomeQueued {
			t.Fatalf("%s: Accept = %v, %v; want queued", ev.Key, res.Outcome, err)
		}
		seq := b.count(t, `SELECT last_value FROM jobs_id_seq`)
		for _, state := range []string{"queued", "done"} {
			if state == "done" {
				if res, err := p.ApplyQueued(t.Context(), txhook.QueuedJob{Source: "test", Key: ev.Key}, insertEffect); err != nil || res.Outcome != txhook.OutcomeProcessed {
					t.Fatalf("%s: ApplyQueued = %v, %v; want processed", ev.Key, res.Outcome, err)
				}
			}
			res, err := p.Accept(t.Context(), ev, guard, enqueueJobQuery)
			if err != nil || res.Outcome != txhook.OutcomeDuplicate {
				t.Fatalf("%s %s: redelivery: Accept = %v, %v; want duplicate", ev.Key, state, res.Outcome, err)
			}
			if got := b.count(t, `SELECT last_value FROM jobs_id_seq`); got != seq {
				t.Errorf("%s %s: the jobs sequence moved from %d to %d: the redelivery's job insert ran", ev.Key, state, seq, got)
			}
		}
	}
}

// enqueueJobQuery is enqueueJob through Query, as River's InsertTx sends its
// insert: a multi-row query, which the engine's first batch must carry too.
func enqueueJobQuery(ctx context.Context, tx pgx.Tx, ev txhook.Event) (int64, error) {
	rows, err := tx.Query(ctx, `INSERT INTO jobs (key) VALUES ($1) RETURNING id`, ev.Key)
	if err != nil {
		return 0, err
	}
	return pgx.CollectExactlyOneRow(rows, pgx.RowTo[int64])
}

// TestAcceptTwoRoundTrips checks the accept's statements: the key's check
// and the job's insert travel with BEGIN and the row's insert, with the
// job's id, with COMMIT. A duplicate is answered by the check, in the first
// round trip (the server skips the job's insert after it), then ROLLBACK.
func TestAcceptTwoRoundTrips(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.jobsTable(t)
	p, tr := tracedProcessor(t, b, nil)
	// The first call on a connection also prepares the statements.
	if res, err := p.Accept(t.Context(), event("a-warm"), nil, enqueueJobQuery); err != nil || res.Outcome != txhook.OutcomeQueued {
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
		res, err := p.Accept(t.Context(), event("a-1"), nil, enqueueJobQuery)
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

// TestAcceptWithReplayGuard: the guard's check runs before the row's insert,
// which travels with COMMIT while the guard's lock is still held: a body
// accepted under one key is a replay under another, also when the two
// deliveries overlap, and nothing of the replay is written.
func TestAcceptWithReplayGuard(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.jobsTable(t)
	p := b.processor(t, nil)
	g := &txhook.ReplayGuard{LockTimeout: 100 * time.Millisecond}
	withHash := func(key, hash string) txhook.Event {
		ev := event(key)
		ev.PayloadHash = []byte(hash)
		return ev
	}
	accept := func(ev txhook.Event) (txhook.Result, error) {
		return p.Accept(t.Context(), ev, g, enqueueJobQuery)
	}
	if res, err := accept(withHash("k-1", "h-1")); err != nil || res.Outcome != txhook.OutcomeQueued {
		t.Fatalf("Accept = %v, %v; want queued", res.Outcome, err)
	}
	if res, err := accept(withHash("k-1", "h-1")); err != nil || res.Outcome != txhook.OutcomeDuplicate {
		t.Fatalf("redelivery: Accept = %v, %v; want duplicate", res.Outcome, err)
	}
	if _, err := accept(withHash("k-2", "h-1")); !isReplayOf(err, "k-1") {
		t.Fatalf("same body, new key: Accept error = %v, want a replay of k-1", err)
	}

	// Overlapping: the first delivery's transaction holds the guard's lock,
	// its row inserted, while the second checks.
	tx, err := b.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if res, err := p.AcceptTx(t.Context(), tx, withHash("k-3", "h-3"), g, enqueueJobQuery); err != nil || res.Outcome != txhook.OutcomeQueued {
		t.Fatalf("AcceptTx = %v, %v; want queued", res.Outcome, err)
	}
	if _, err := accept(withHash("k-4", "h-3")); !errors.Is(err, txhook.ErrReplayInFlight) {
		t.Fatalf("while the first holds the lock: Accept error = %v, want ErrReplayInFlight", err)
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
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

func isReplayOf(err error, key string) bool {
	re, ok := errors.AsType[*txhook.ReplayError](err)
	return ok && re.Key == key
}

func TestAcceptRollsBackWhenEnqueueFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, nil)
	boom := errors.New("queue full")
	_, err := p.Accept(t.Context(), event("a-1"), nil, func(context.Context, pgx.Tx, txhook.Event) (int64, error) { return 0, boom })
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
	b.jobsTable(t)
	p := b.processor(t, &txhook.Config{LockTimeout: 100 * time.Millisecond})
	tx, err := b.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if res, err := p.AcceptTx(t.Context(), tx, event("a-1"), nil, enqueueJob); err != nil || res.Outcome != txhook.OutcomeQueued {
		t.Fatalf("AcceptTx = %v, %v; want queued", res.Outcome, err)
	}
	res, err := p.Accept(t.Context(), event("a-1"), nil, enqueueJob)
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

func TestApplyQueuedSettledOnlyCompletes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.jobsTable(t)
	p := b.processor(t, nil)
	mustProcess(t, p, event("a-1"), insertEffect, txhook.OutcomeProcessed)
	if _, err := b.pool.Exec(t.Context(), `INSERT INTO jobs (key) VALUES ('a-1'), ('gone')`); err != nil {
		t.Fatal(err)
	}
	ran := false
	h := func(context.Context, pgx.Tx, txhook.Event) error { ran = true; return nil }
	for _, key := range []string{"a-1", "gone"} {
		res, err := p.ApplyQueued(t.Context(), txhook.QueuedJob{Source: "test", Key: key, Complete: completeJob(key)}, h)
		if err != nil || res.Outcome != txhook.OutcomeDuplicate {
			t.Fatalf("ApplyQueued(%s) = %v, %v; want duplicate", key, res.Outcome, err)
		}
	}
	if ran {
		t.Fatal("the handler ran for a settled or missing event")
	}
	if n := b.count(t, `SELECT count(*) FROM jobs`); n != 0 {
		t.Fatalf("%d jobs left, want both completed", n)
	}
	if n := b.effects(t, "a-1"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

func TestApplyQueuedErrorKeepsEventQueued(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.jobsTable(t)
	p := b.processor(t, nil)
	if _, err := p.Accept(t.Context(), event("a-1"), nil, enqueueJob); err != nil {
		t.Fatal(err)
	}
	failing := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		if err := insertEffect(ctx, tx, ev); err != nil {
			return err
		}
		return errors.New("try again")
	}
	j := txhook.QueuedJob{Source: "test", Key: "a-1", Complete: completeJob("a-1")}
	if _, err := p.ApplyQueued(t.Context(), j, failing); err == nil {
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
	res, err := p.ApplyQueued(t.Context(), j, failing)
	if err != nil || res.Outcome != txhook.OutcomeFailed || res.Err == nil {
		t.Fatalf("last attempt = %+v, %v; want failed", res, err)
	}
	rec, err = txhook.GetEventRecord(t.Context(), b.pool, "test", "a-1")
	if err != nil || rec.Status != txhook.StatusFailed || !rec.HasPayload {
		t.Fatalf("record = %+v, %v; want failed with its payload (a dead letter)", rec, err)
	}
}
