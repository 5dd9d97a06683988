package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river/rivertype"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/inbox"
)

// replayer returns a Processor whose routes for github are tx for push and
// lease for the type lease: the application once it is fixed, replaying.
func (s setup) replayer(t *testing.T, tx txhook.HandlerFunc, lease txhook.LeaseHandler) *txhook.Processor {
	t.Helper()
	routes := txhook.NewRoutes()
	routes.Inbox("github", "push", tx)
	routes.InboxLease("github", "lease", lease)
	p, err := txhook.NewProcessor(s.db.Pool, &txhook.Config{Routes: routes})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// applyLease is a lease-mode handler whose phase two is apply.
var applyLease = txhook.LeaseHandler{Lease: 5 * time.Second,
	Work: func(_ context.Context, _ txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
		return func(ctx context.Context, tx pgx.Tx) error { return apply(ctx, tx, ev) }, nil
	}}

// A handler that panics on every try: River discards the job after its last
// attempt, and the event is then a dead letter with the panic as its error,
// on a transactional route and on a lease route alike (it was left queued,
// and in progress, for ever); a replay applies it once.
func TestPanicOnEveryTryIsADeadLetter(t *testing.T) {
	t.Parallel()
	s := newSetup(t, &inbox.Config{MaxAttempts: 2})
	var tries atomic.Int32
	s.routes.Inbox("github", "push", func(context.Context, pgx.Tx, txhook.Event) error {
		tries.Add(1)
		panic("boom")
	})
	s.routes.InboxLease("github", "lease", txhook.LeaseHandler{Lease: 5 * time.Second,
		Work: func(context.Context, txhook.Claim, txhook.Event) (txhook.TxFunc, error) {
			tries.Add(1)
			panic("boom")
		}})
	for _, ev := range []txhook.Event{{Source: "github", Key: "tx-1", Type: "push", Payload: []byte(`{}`)}, {Source: "github", Key: "lease-1", Type: "lease", Payload: []byte(`{}`)}} {
		if _, err := s.accept(t, ev); err != nil {
			t.Fatal(err)
		}
	}
	s.start(t)
	for _, key := range []string{"tx-1", "lease-1"} {
		rec := s.waitStatusWithin(t, 10*time.Second, key, txhook.StatusFailed)
		s.waitJobState(t, rec.JobID, string(rivertype.JobStateDiscarded))
		if !strings.Contains(rec.LastError, "handler panicked: boom") || !rec.HasPayload {
			t.Errorf("%s: dead letter %+v, want the panic as its error and its payload", key, rec)
		}
	}
	if n := tries.Load(); n != 4 {
		t.Errorf("handlers ran %d times, want 4 (2 attempts each)", n)
	}
	rp := s.replayer(t, apply, applyLease)
	for _, key := range []string{"tx-1", "lease-1"} {
		if res, err := rp.Replay(t.Context(), "github", key); err != nil || res.Outcome != txhook.OutcomeProcessed {
			t.Fatalf("%s: Replay = %v, %v; want processed", key, res.Outcome, err)
		}
		if n := s.applied(t, key); n != 1 {
			t.Errorf("%s: applied %d times after the replay, want 1", key, n)
		}
	}
}

// A shutdown on a job's only attempt, by Stop past its deadline (River's
// StopAndCancel) or by the end of Start's context: the cancelled apply is not
// the handler's failure. The event stays queued (a lease route's claim
// released), River leaves the job available with the try not counted, and
// the next inbox applies the event once.
func TestShutdownOnLastAttemptKeepsTheEvent(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		stop func(t *testing.T, ib *inbox.Inbox, cancelStart context.CancelFunc)
	}{
		{"Stop", func(t *testing.T, ib *inbox.Inbox, _ context.CancelFunc) {
			ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
			defer cancel()
			if err := ib.Stop(ctx); err != nil {
				t.Fatal(err)
			}
		}},
		{"Start's context", func(t *testing.T, ib *inbox.Inbox, cancelStart context.CancelFunc) {
			cancelStart()
			select {
			case <-ib.Client().Stopped():
			case <-time.After(10 * time.Second):
				t.Fatal("the inbox did not stop within 10s of its context's end")
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := newSetup(t, &inbox.Config{MaxAttempts: 1})
			running := make(chan string, 2)
			slow := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
				running <- ev.Key
				// Until cancelled, or 3 s when the cancel request reaches
				// the server before the statement does (it then cancels
				// nothing, and the statement holds the event's row lock
				// until it ends: the restarted inbox below waits for it).
				_, err := tx.Exec(ctx, `SELECT pg_sleep(3)`)
				return err
			}
			s.routes.Inbox("github", "push", slow)
			s.routes.InboxLease("github", "lease", txhook.LeaseHandler{Lease: 5 * time.Second,
				Work: func(ctx context.Context, _ txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
					running <- ev.Key
					<-ctx.Done()
					return nil, fmt.Errorf("notify: %v", ctx.Err()) // not wrapped, as some handlers do
				}})
			jobs := map[string]int64{}
			for _, ev := range []txhook.Event{{Source: "github", Key: "tx-1", Type: "push", Payload: []byte(`{}`)}, {Source: "github", Key: "lease-1", Type: "lease", Payload: []byte(`{}`)}} {
				if _, err := s.accept(t, ev); err != nil {
					t.Fatal(err)
				}
				jobs[ev.Key] = s.record(t, ev.Key).JobID
			}
			startCtx, cancelStart := context.WithCancel(t.Context())
			defer cancelStart()
			if err := s.ib.Start(startCtx); err != nil {
				t.Fatal(err)
			}
			for range 2 {
				select {
				case <-running:
				case <-time.After(15 * time.Second):
					t.Fatal("the jobs did not start within 15s")
				}
			}
			c.stop(t, s.ib, cancelStart)

			want := map[string]txhook.Status{"tx-1": txhook.StatusQueued, "lease-1": txhook.StatusInProgress}
			for key, status := range want {
				if rec := s.record(t, key); rec.Status != status {
					t.Errorf("%s after the shutdown: status %q (last error %q), want %q", key, rec.Status, rec.LastError, status)
				}
				if state, attempt := s.job(t, jobs[key]); state != string(rivertype.JobStateAvailable) || attempt != 0 {
					t.Errorf("%s: job %s at attempt %d, want available at 0 (the cut try not counted)", key, state, attempt)
				}
			}

			// After the restart, a worker that does not hang applies both.
			next := newSetupOn(t, s.db, nil)
			next.routes.Inbox("github", "push", apply)
			next.routes.InboxLease("github", "lease", applyLease)
			next.start(t)
			for key := range want {
				rec := next.waitStatusWithin(t, 10*time.Second, key, txhook.StatusDone)
				if n := next.applied(t, key); n != 1 {
					t.Errorf("%s: applied %d times after the restart, want 1", key, n)
				}
				next.waitJobState(t, rec.JobID, string(rivertype.JobStateCompleted))
			}
		})
	}
}

// Events whose River job ended without applying them, or is gone, are
// stuck: listed as such, recorded as failed by the inbox's check (a dead
// letter whose error names the job), and replayed. Events whose job is live,
// and those of other sources, are left alone.
func TestStuckEventsBecomeDeadLetters(t *testing.T) {
	t.Parallel()
	s := newSetup(t, nil)
	s.routes.Inbox("github", "push", apply)
	s.routes.InboxLease("github", "lease", applyLease)
	// Another application's inbox, on the same database: its source's
	// events are not this inbox's to judge.
	shop := txhook.NewRoutes()
	shop.Inbox("shop", "push", apply)
	other, err := txhook.NewProcessor(s.db.Pool, &txhook.Config{Routes: shop})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inbox.New(s.db.Pool, other, &inbox.Config{Queue: "other_inbox", River: riverConfig()}); err != nil {
		t.Fatal(err)
	}
	jobs := map[string]int64{}
	for _, ev := range []txhook.Event{
		{Source: "github", Key: "deleted", Type: "push", Payload: []byte(`{}`)},
		{Source: "github", Key: "discarded", Type: "push", Payload: []byte(`{}`)},
		{Source: "github", Key: "cancelled", Type: "push", Payload: []byte(`{}`)},
		{Source: "github", Key: "lease-discarded", Type: "lease", Payload: []byte(`{}`)},
		{Source: "github", Key: "live", Type: "push", Payload: []byte(`{}`)},
		{Source: "shop", Key: "other-source", Type: "push", Payload: []byte(`{}`)},
	} {
		p := s.proc
		if ev.Source == "shop" {
			p = other
		}
		if _, err := p.Deliver(t.Context(), ev, nil); err != nil {
			t.Fatal(err)
		}
		rec, err := txhook.GetEventRecord(t.Context(), s.db.Pool, ev.Source, ev.Key)
		if err != nil {
			t.Fatal(err)
		}
		jobs[ev.Key] = rec.JobID
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := s.db.Pool.Exec(t.Context(), sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	exec(`DELETE FROM river_job WHERE id = $1`, jobs["deleted"])
	for _, key := range []string{"discarded", "lease-discarded", "other-source"} {
		exec(`UPDATE river_job SET state = 'discarded', finalized_at = now(),
			errors = ARRAY[jsonb_build_object('attempt', 1, 'at', now(), 'error', 'stuck job rescued')] WHERE id = $1`, jobs[key])
	}
	if _, err := s.ib.Client().JobCancel(t.Context(), jobs["cancelled"]); err != nil {
		t.Fatal(err)
	}
	// The lease route's claim was taken and its worker died: its lease ended.
	exec(`UPDATE txhook_processed_events SET status = 'in_progress', lease_expires_at = now() - interval '1 second'
		WHERE event_key = 'lease-discarded'`)

	stuck := []string{"cancelled", "deleted", "discarded", "lease-discarded"}
	listed, err := txhook.ListEvents(t.Context(), s.db.Pool, txhook.EventFilter{Source: "github", Stuck: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := keys(listed); fmt.Sprint(got) != fmt.Sprint(stuck) {
		t.Errorf("stuck events listed: %v, want %v", got, stuck)
	}

	failed, err := s.ib.FailStuck(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got := keys(failed); fmt.Sprint(got) != fmt.Sprint(stuck) {
		t.Errorf("stuck events recorded as failed: %v, want %v", got, stuck)
	}
	wantErr := map[string]string{
		"deleted":         fmt.Sprintf("its queue job %d was deleted", jobs["deleted"]),
		"discarded":       fmt.Sprintf("its queue job %d is discarded and never applied the event; last error: stuck job rescued", jobs["discarded"]),
		"cancelled":       fmt.Sprintf("its queue job %d is cancelled", jobs["cancelled"]),
		"lease-discarded": fmt.Sprintf("its queue job %d is discarded", jobs["lease-discarded"]),
	}
	for key, want := range wantErr {
		if rec := s.record(t, key); rec.Status != txhook.StatusFailed || !strings.Contains(rec.LastError, want) || !rec.HasPayload {
			t.Errorf("%s: %+v, want a dead letter with its payload whose error says %q", key, rec, want)
		}
	}
	for _, key := range []string{"live", "other-source"} {
		rec, err := txhook.GetEventRecord(t.Context(), s.db.Pool, map[string]string{"live": "github", "other-source": "shop"}[key], key)
		if err != nil || rec.Status != txhook.StatusQueued {
			t.Errorf("%s: %+v, %v; want it left queued", key, rec, err)
		}
	}
	if again, err := s.ib.FailStuck(t.Context()); err != nil || len(again) != 0 {
		t.Errorf("second check = %v, %v; want nothing left", keys(again), err)
	}

	// Stuck and not yet checked: the replay takes it over.
	if _, err := s.accept(t, txhook.Event{Source: "github", Key: "late", Type: "push", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	exec(`DELETE FROM river_job WHERE id = $1`, s.record(t, "late").JobID)
	stuck = append(stuck, "late")

	rp := s.replayer(t, apply, applyLease)
	for _, key := range stuck {
		if res, err := rp.Replay(t.Context(), "github", key); err != nil || res.Outcome != txhook.OutcomeProcessed {
			t.Errorf("%s: Replay = %v, %v; want processed", key, res.Outcome, err)
		}
		if n := s.applied(t, key); n != 1 {
			t.Errorf("%s: applied %d times after the replay, want 1", key, n)
		}
	}
	// A queued event whose job is live is its job's to apply.
	if _, err := rp.Replay(t.Context(), "github", "live"); !errors.Is(err, txhook.ErrNotFailed) {
		t.Errorf("Replay of an event whose job is live: %v, want ErrNotFailed", err)
	}
}

// The inbox checks for stuck events when it starts (and every
// StuckCheckEvery), on River's leader: an event whose job was deleted while
// no worker ran becomes a dead letter without anyone asking.
func TestStuckCheckRunsOnStart(t *testing.T) {
	t.Parallel()
	s := newSetup(t, nil)
	s.routes.Inbox("github", "push", apply)
	if _, err := s.accept(t, txhook.Event{Source: "github", Key: "d-1", Type: "push", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.Pool.Exec(t.Context(), `DELETE FROM river_job`); err != nil {
		t.Fatal(err)
	}
	s.start(t)
	rec := s.waitStatusWithin(t, 10*time.Second, "d-1", txhook.StatusFailed)
	if !strings.Contains(rec.LastError, "was deleted before it applied the event") {
		t.Errorf("last error %q, want it to say the job was deleted", rec.LastError)
	}
	if n := s.applied(t, "d-1"); n != 0 {
		t.Errorf("applied %d times, want 0", n)
	}
}

func keys(evs []txhook.EventRecord) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Key
	}
	slices.Sort(out)
	return out
}

// Every failed try is logged through the Processor's logger, with the event,
// the try's number, the error and the next try, which is the time River
// then scheduled; the last one's dead letter too.
func TestFailedTriesAreLogged(t *testing.T) {
	t.Parallel()
	s := newSetup(t, &inbox.Config{MaxAttempts: 2})
	s.routes.Inbox("github", "push", func(context.Context, pgx.Tx, txhook.Event) error { return errors.New("downstream said no") })
	if _, err := s.accept(t, txhook.Event{Source: "github", Key: "d-1", Type: "push", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	s.start(t)
	rec := s.waitStatusWithin(t, 10*time.Second, "d-1", txhook.StatusFailed)
	s.waitJobState(t, rec.JobID, string(rivertype.JobStateDiscarded))
	var tries []map[string]any
	for _, r := range s.logs.records(t) {
		if r["key"] == "d-1" {
			tries = append(tries, r)
		}
	}
	if len(tries) != 2 {
		t.Fatalf("logged %d records for the event, want 2: %v", len(tries), tries)
	}
	first, last := tries[0], tries[1]
	if first["level"] != "WARN" || first["source"] != "github" || first["type"] != "push" || first["attempt"] != 1.0 ||
		first["err"] != "handle event: downstream said no" || !strings.Contains(first["msg"].(string), "runs again") {
		t.Errorf("first try's record = %v", first)
	}
	// River scheduled the second try at the logged time (discarding the
	// job after it left the time as it was).
	next, err := time.Parse(time.RFC3339Nano, fmt.Sprint(first["next_try"]))
	if err != nil {
		t.Fatalf("first try's next_try %v: %v", first["next_try"], err)
	}
	var scheduled time.Time
	if err := s.db.Pool.QueryRow(t.Context(), `SELECT scheduled_at FROM river_job WHERE id = $1`, rec.JobID).Scan(&scheduled); err != nil {
		t.Fatal(err)
	}
	if !scheduled.Equal(next.Truncate(time.Microsecond)) {
		t.Errorf("first try logged its next try at %v; River scheduled it at %v", next, scheduled)
	}
	if last["level"] != "ERROR" || last["attempt"] != 2.0 || !strings.Contains(last["msg"].(string), "dead letter") {
		t.Errorf("last try's record = %v", last)
	}
}
