package inbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/inbox"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/migrations"
	"github.com/txhook/txhook/txhooktest"
)

// childEnv holds the database URL when the test binary runs as a crashing
// worker (see crashEachPoint), and childQueueEnv the River queue it works.
const (
	childEnv      = "TXHOOK_INBOX_CHILD_DB"
	childQueueEnv = "TXHOOK_INBOX_CHILD_QUEUE"
)

func TestMain(m *testing.M) {
	if u := os.Getenv(childEnv); u != "" {
		os.Exit(runChild(u))
	}
	testdb.Main(m)
}

// template is txhook's schema, River's, and the tests' applied table.
var template = testdb.Template{
	Name:  "inbox_river_0512",
	Files: []fs.FS{migrations.FS},
	Migrate: func(ctx context.Context, url string) error {
		if err := migrations.Up(ctx, url); err != nil {
			return err
		}
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			return err
		}
		defer pool.Close()
		if err := inbox.Migrate(ctx, pool); err != nil {
			return err
		}
		_, err = pool.Exec(ctx, `CREATE TABLE applied (key text PRIMARY KEY, n integer NOT NULL DEFAULT 1)`)
		return err
	},
}

// apply is the tests' handler: it counts how often each event was applied.
func apply(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
	_, err := tx.Exec(ctx, `INSERT INTO applied (key) VALUES ($1)
		ON CONFLICT (key) DO UPDATE SET n = applied.n + 1`, ev.Key)
	return err
}

// fastRetry retries a failed job after 50ms, so that tests need not wait for
// River's backoff.
type fastRetry struct{}

func (fastRetry) NextRetry(*rivertype.JobRow) time.Time { return time.Now().Add(50 * time.Millisecond) }

func riverConfig() *river.Config {
	return &river.Config{
		RetryPolicy:          fastRetry{},
		FetchCooldown:        5 * time.Millisecond,
		FetchPollInterval:    50 * time.Millisecond,
		JobTimeout:           time.Second,
		RescueStuckJobsAfter: 2 * time.Second,
		Logger:               quietLogger(),
	}
}

type setup struct {
	db     *testdb.DB
	routes *txhook.Routes // the processor's, registered by each test
	proc   *txhook.Processor
	ib     *inbox.Inbox
	logs   *logBuffer // the processor's log, JSON lines
}

func newSetup(t *testing.T, cfg *inbox.Config) setup {
	t.Helper()
	return newSetupOn(t, testdb.New(t, template), cfg)
}

// newSetupOn is newSetup on d, a database with both schemas and the
// applied table.
func newSetupOn(t *testing.T, d *testdb.DB, cfg *inbox.Config) setup {
	t.Helper()
	logs := &logBuffer{}
	routes := txhook.NewRoutes()
	proc, err := txhook.NewProcessor(d.Pool, &txhook.Config{Routes: routes, Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if cfg == nil {
		cfg = &inbox.Config{}
	}
	if cfg.River == nil {
		cfg.River = riverConfig()
	}
	ib, err := inbox.New(d.Pool, proc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return setup{db: d, routes: routes, proc: proc, ib: ib, logs: logs}
}

// acceptor returns a processor with s's routes whose inbox, never started,
// queues its jobs in queue ("" for the default): to accept events into
// another River queue than s's.
func (s setup) acceptor(t *testing.T, queue string) *txhook.Processor {
	t.Helper()
	p, err := txhook.NewProcessor(s.db.Pool, &txhook.Config{Routes: s.routes})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inbox.New(s.db.Pool, p, &inbox.Config{Queue: queue, River: riverConfig()}); err != nil {
		t.Fatal(err)
	}
	return p
}

// accept delivers ev to s's processor: into the inbox, for a type with an
// inbox route.
func (s setup) accept(t *testing.T, ev txhook.Event) (txhook.Result, error) {
	t.Helper()
	return s.proc.Deliver(t.Context(), ev, nil)
}

func (s setup) start(t *testing.T) {
	t.Helper()
	if err := s.ib.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.ib.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
}

// waitStatus waits up to 90s for the event's row to reach status: a job
// whose worker died waits for River's rescuer, which runs on an interval of
// its own (about half a minute) and, on a loaded machine, later.
func (s setup) waitStatus(t *testing.T, key string, status txhook.Status) txhook.EventRecord {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		rec, err := txhook.GetEventRecord(t.Context(), s.db.Pool, "github", key)
		if err == nil && rec.Status == status {
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatalf("event %s: status %q (err %v), want %q", key, rec.Status, err, status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitUntil waits up to within for cond, and fails t with what otherwise.
func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// record returns the event's record, failing t if it is not found.
func (s setup) record(t *testing.T, key string) txhook.EventRecord {
	t.Helper()
	rec, err := txhook.GetEventRecord(t.Context(), s.db.Pool, "github", key)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// waitStatusWithin is waitStatus for a job that needs no rescue: it fails
// after within.
func (s setup) waitStatusWithin(t *testing.T, within time.Duration, key string, status txhook.Status) txhook.EventRecord {
	t.Helper()
	var rec txhook.EventRecord
	waitUntil(t, within, fmt.Sprintf("event %s reaches status %s", key, status), func() bool {
		rec = s.record(t, key)
		return rec.Status == status
	})
	return rec
}

func (s setup) applied(t *testing.T, key string) int {
	t.Helper()
	var n int
	err := s.db.Pool.QueryRow(t.Context(), `SELECT n FROM applied WHERE key = $1`, key).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (s setup) jobState(t *testing.T, id int64) string {
	t.Helper()
	var state string
	if err := s.db.Pool.QueryRow(t.Context(), `SELECT state FROM river_job WHERE id = $1`, id).Scan(&state); err != nil {
		t.Fatal(err)
	}
	return state
}

// waitJobState waits up to 30s for the job to reach state.
func (s setup) waitJobState(t *testing.T, id int64, state string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for s.jobState(t, id) != state {
		if time.Now().After(deadline) {
			t.Fatalf("job %d: state %q, want %q", id, s.jobState(t, id), state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// job returns the River job's state and attempt.
func (s setup) job(t *testing.T, id int64) (state string, attempt int) {
	t.Helper()
	if err := s.db.Pool.QueryRow(t.Context(), `SELECT state, attempt FROM river_job WHERE id = $1`, id).Scan(&state, &attempt); err != nil {
		t.Fatal(err)
	}
	return state, attempt
}

func (s setup) jobs(t *testing.T) int {
	t.Helper()
	var n int
	if err := s.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM river_job`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

var secret = "It's a Secret to Everybody"

// endpoint returns a GitHub endpoint of s's processor, on an httptest
// server.
func (s setup) endpoint(t *testing.T) *httptest.Server {
	t.Helper()
	ep, err := handler.New(s.proc, &handler.Config{
		Source:   "github",
		Provider: &handler.GitHub{Secrets: []string{secret}},
		Logger:   quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(ep)
	t.Cleanup(srv.Close)
	return srv
}

// deliver posts a signed push with delivery id key and returns the status.
func deliver(t *testing.T, srv *httptest.Server, key string) int {
	t.Helper()
	code, _ := deliverBody(t, srv, key, []byte(fmt.Sprintf(`{"ref":"refs/heads/main","after":%q}`, key)))
	return code
}

// deliverBody posts body, signed, as a push with delivery id key, and
// returns the answer's status and body.
func deliverBody(t *testing.T, srv *httptest.Server, key string, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-GitHub-Event", "push")
	req.Header.Set("X-GitHub-Delivery", key)
	if err := (&handler.GitHub{Secrets: []string{secret}}).Sign(req.Header, body, time.Now()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(answer)
}

func TestAcceptThenApply(t *testing.T) {
	t.Parallel()
	s := newSetup(t, nil)
	s.routes.Inbox("github", "push", apply)
	srv := s.endpoint(t)
	if got := deliver(t, srv, "d-1"); got != http.StatusAccepted {
		t.Fatalf("delivery answered %d, want 202", got)
	}
	rec, err := txhook.GetEventRecord(t.Context(), s.db.Pool, "github", "d-1")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != txhook.StatusQueued || rec.JobID == 0 || !rec.HasPayload {
		t.Fatalf("accepted record = %+v, want queued with its job and payload", rec)
	}
	if n := s.applied(t, "d-1"); n != 0 {
		t.Fatalf("applied %d times before the worker ran", n)
	}
	s.start(t)
	done := s.waitStatus(t, "d-1", txhook.StatusDone)
	if n := s.applied(t, "d-1"); n != 1 {
		t.Fatalf("applied %d times, want 1", n)
	}
	if done.JobID != rec.JobID || done.HasPayload {
		t.Errorf("done record = %+v: want job %d kept, payload dropped (StorePayload off)", done, rec.JobID)
	}
	// River completes the job after the worker returns.
	s.waitJobState(t, rec.JobID, string(rivertype.JobStateCompleted))
}

func TestDuplicateWhileQueuedAndAfterDone(t *testing.T) {
	t.Parallel()
	s := newSetup(t, nil)
	s.routes.Inbox("github", "push", apply)
	srv := s.endpoint(t)
	if got := deliver(t, srv, "d-1"); got != http.StatusAccepted {
		t.Fatalf("first delivery answered %d, want 202", got)
	}
	if got := deliver(t, srv, "d-1"); got != http.StatusOK {
		t.Fatalf("redelivery while queued answered %d, want 200", got)
	}
	// A synchronous route sees the queued key as a duplicate too.
	res, err := s.proc.Process(t.Context(), txhook.Event{Source: "github", Key: "d-1"}, apply)
	if err != nil || res.Outcome != txhook.OutcomeDuplicate {
		t.Fatalf("Process of a queued key = %v, %v; want duplicate", res.Outcome, err)
	}
	s.start(t)
	s.waitStatus(t, "d-1", txhook.StatusDone)
	if got := deliver(t, srv, "d-1"); got != http.StatusOK {
		t.Fatalf("redelivery after done answered %d, want 200", got)
	}
	if n := s.jobs(t); n != 1 {
		t.Errorf("%d jobs, want 1", n)
	}
	if n := s.applied(t, "d-1"); n != 1 {
		t.Errorf("applied %d times, want 1", n)
	}
}

// TestConcurrentAcceptsOneJob accepts one key from many goroutines at once:
// one is queued, each other is a duplicate or in flight (its River job
// rolled back with its transaction), and one job and one row remain, the row
// naming the job.
func TestConcurrentAcceptsOneJob(t *testing.T) {
	t.Parallel()
	s := newSetup(t, nil)
	s.routes.Inbox("github", "push", apply)
	ev := txhook.Event{Source: "github", Key: "d-1", Type: "push", Payload: []byte(`{}`)}
	const n = 8
	var (
		wg       sync.WaitGroup
		outcomes [n]txhook.Outcome
		errs     [n]error
	)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			res, err := s.accept(t, ev)
			outcomes[i], errs[i] = res.Outcome, err
		})
	}
	close(start)
	wg.Wait()
	queued := 0
	for i := range n {
		switch {
		case errs[i] != nil:
			t.Errorf("accept %d: %v", i, errs[i])
		case outcomes[i] == txhook.OutcomeQueued:
			queued++
		case outcomes[i] != txhook.OutcomeDuplicate && outcomes[i] != txhook.OutcomeInFlight:
			t.Errorf("accept %d: outcome %v, want queued, duplicate or in flight", i, outcomes[i])
		}
	}
	if queued != 1 {
		t.Errorf("%d accepts queued, want 1", queued)
	}
	if got := s.jobs(t); got != 1 {
		t.Errorf("%d River jobs, want 1", got)
	}
	var rows int
	if err := s.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM txhook_processed_events e
		JOIN river_job j ON j.id = e.job_id WHERE e.event_key = $1`, ev.Key).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 1 {
		t.Errorf("%d rows naming a River job, want 1", rows)
	}
}

func TestErrorThenSuccess(t *testing.T) {
	t.Parallel()
	s := newSetup(t, nil)
	var tries atomic.Int32
	s.routes.Inbox("github", "push", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		if err := apply(ctx, tx, ev); err != nil {
			return err
		}
		if tries.Add(1) == 1 {
			return errors.New("first try fails")
		}
		return nil
	})
	if res, err := s.accept(t, txhook.Event{Source: "github", Key: "d-1", Type: "push"}); err != nil || res.Outcome != txhook.OutcomeQueued {
		t.Fatalf("Accept = %v, %v; want queued", res.Outcome, err)
	}
	s.start(t)
	rec := s.waitStatus(t, "d-1", txhook.StatusDone)
	if n := s.applied(t, "d-1"); n != 1 {
		t.Fatalf("applied %d times, want 1 (the failed try rolled back)", n)
	}
	if tries.Load() != 2 || rec.Attempts != 2 || rec.LastError == "" {
		t.Errorf("tries %d, record %+v: want 2 tries, 2 attempts and the first error kept", tries.Load(), rec)
	}
}

func TestPermanentThenReplay(t *testing.T) {
	t.Parallel()
	s := newSetup(t, nil)
	var fail atomic.Bool
	fail.Store(true)
	h := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		if err := apply(ctx, tx, ev); err != nil {
			return err
		}
		if fail.Load() {
			return txhook.Permanent(errors.New("unknown repository"))
		}
		return nil
	}
	s.routes.Inbox("github", "push", h)
	if _, err := s.accept(t, txhook.Event{Source: "github", Key: "d-1", Type: "push", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	s.start(t)
	rec := s.waitStatus(t, "d-1", txhook.StatusFailed)
	s.waitJobState(t, rec.JobID, string(rivertype.JobStateCancelled))
	if n := s.applied(t, "d-1"); n != 0 || !rec.HasPayload || rec.LastError == "" {
		t.Fatalf("applied %d, record %+v: want the writes rolled back and a dead letter with payload", n, rec)
	}
	fail.Store(false)
	if res, err := s.proc.Replay(t.Context(), "github", "d-1"); err != nil || res.Outcome != txhook.OutcomeProcessed {
		t.Fatalf("Replay = %v, %v; want processed", res.Outcome, err)
	}
	if n := s.applied(t, "d-1"); n != 1 {
		t.Errorf("applied %d times after replay, want 1", n)
	}
}

func TestLastAttemptFails(t *testing.T) {
	t.Parallel()
	s := newSetup(t, &inbox.Config{MaxAttempts: 2})
	var tries atomic.Int32
	s.routes.Inbox("github", "push", func(context.Context, pgx.Tx, txhook.Event) error {
		tries.Add(1)
		return errors.New("always fails")
	})
	if _, err := s.accept(t, txhook.Event{Source: "github", Key: "d-1", Type: "push"}); err != nil {
		t.Fatal(err)
	}
	s.start(t)
	rec := s.waitStatus(t, "d-1", txhook.StatusFailed)
	s.waitJobState(t, rec.JobID, string(rivertype.JobStateDiscarded))
	if tries.Load() != 2 {
		t.Errorf("handler ran %d times, want 2 (MaxAttempts)", tries.Load())
	}
}

// An event whose type has no route when its job runs (the route was
// removed by a deploy after the event was accepted) is recorded as failed
// and its job cancelled: an operator can replay it once a route is
// registered again (it is not left queued with its only job gone).
func TestNoHandlerFailsTheEvent(t *testing.T) {
	t.Parallel()
	s := newSetup(t, nil)
	s.routes.Inbox("github", "push", apply)
	// Accepted by a deploy that had a route for issues.
	before := txhook.NewRoutes()
	before.Inbox("github", "issues", apply)
	acc, err := txhook.NewProcessor(s.db.Pool, &txhook.Config{Routes: before})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inbox.New(s.db.Pool, acc, &inbox.Config{River: riverConfig()}); err != nil {
		t.Fatal(err)
	}
	if res, err := acc.Deliver(t.Context(), txhook.Event{Source: "github", Key: "i-1", Type: "issues"}, nil); err != nil || res.Outcome != txhook.OutcomeQueued {
		t.Fatalf("accept = %v, %v; want queued", res.Outcome, err)
	}
	s.start(t)
	rec := s.waitStatus(t, "i-1", txhook.StatusFailed)
	s.waitJobState(t, rec.JobID, string(rivertype.JobStateCancelled))
	if !strings.Contains(rec.LastError, "no handler") {
		t.Errorf("last error %q, want it to name the missing handler", rec.LastError)
	}
	if n := s.applied(t, "i-1"); n != 0 {
		t.Errorf("applied %d times, want 0", n)
	}
}

// The database session dies under the apply on the job's only attempt, three
// times: not the handler's failure, so the event is never recorded as
// failed, and River never gives the job up (it would discard it, the event
// queued for ever): the job is snoozed and tried again, on either kind of
// route, until the database answers and the event is applied once.
func TestLastAttemptDatabaseDownIsNotAFailure(t *testing.T) {
	t.Parallel()
	s := newSetup(t, &inbox.Config{MaxAttempts: 1})
	var kills sync.Map // event key -> *atomic.Int32: the tries that killed their session
	killFirst := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		n, _ := kills.LoadOrStore(ev.Key, new(atomic.Int32))
		if n.(*atomic.Int32).Add(1) <= 3 {
			_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
			return err
		}
		return apply(ctx, tx, ev)
	}
	s.routes.Inbox("github", "push", killFirst)
	s.routes.InboxLease("github", "lease", txhook.LeaseHandler{Lease: 5 * time.Second,
		Work: func(_ context.Context, _ txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
			return func(ctx context.Context, tx pgx.Tx) error { return killFirst(ctx, tx, ev) }, nil
		}})
	for _, key := range []string{"tx-1", "lease-1"} {
		typ := map[string]string{"tx-1": "push", "lease-1": "lease"}[key]
		if _, err := s.accept(t, txhook.Event{Source: "github", Key: key, Type: typ}); err != nil {
			t.Fatal(err)
		}
	}
	s.start(t)
	for _, key := range []string{"tx-1", "lease-1"} {
		rec := s.waitStatusWithin(t, 10*time.Second, key, txhook.StatusDone)
		s.waitJobState(t, rec.JobID, string(rivertype.JobStateCompleted))
		if n := s.applied(t, key); n != 1 {
			t.Errorf("%s: applied %d times, want 1", key, n)
		}
		if state, attempt := s.job(t, rec.JobID); attempt != 1 {
			t.Errorf("%s: job %s at attempt %d, want 1 (the tries cut by the fault not counted)", key, state, attempt)
		}
	}
}

func TestLeaseRoute(t *testing.T) {
	t.Parallel()
	s := newSetup(t, nil)
	var mu sync.Mutex
	var calls []string // the idempotency keys sent with each external call
	var tokens []int
	s.routes.InboxLease("github", "push", txhook.LeaseHandler{
		Lease: 5 * time.Second,
		Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
			mu.Lock()
			calls = append(calls, c.IdempotencyKey("notify"))
			tokens = append(tokens, c.Token)
			first := len(calls) == 1
			mu.Unlock()
			if first {
				return nil, errors.New("downstream timed out")
			}
			return func(ctx context.Context, tx pgx.Tx) error { return apply(ctx, tx, ev) }, nil
		},
	})
	if _, err := s.accept(t, txhook.Event{Source: "github", Key: "d-1", Type: "push"}); err != nil {
		t.Fatal(err)
	}
	s.start(t)
	rec := s.waitStatus(t, "d-1", txhook.StatusDone)
	if n := s.applied(t, "d-1"); n != 1 {
		t.Fatalf("applied %d times, want 1", n)
	}
	// The failed try released its claim at once, recording why (a claim
	// left to run out would have been taken over without it).
	if !strings.Contains(rec.LastError, "downstream timed out") {
		t.Errorf("last error = %q, want the released claim's error", rec.LastError)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 2 || calls[0] != calls[1] || calls[0] != txhook.IdempotencyKey("github", "d-1", "notify") {
		t.Errorf("external calls = %q: want two with the event's idempotency key", calls)
	}
	if len(tokens) != 2 || tokens[0] != 1 || tokens[1] != 2 {
		t.Errorf("fencing tokens = %v, want [1 2]", tokens)
	}
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// logBuffer collects log lines from concurrent writers.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// records returns the JSON records logged so far.
func (l *logBuffer) records(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for line := range bytes.Lines(l.b.Bytes()) {
		var r map[string]any
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, r)
	}
	return out
}

// TestCrashPoints accepts one event per crash point of the inbox, runs a
// worker process armed to exit at each, then runs a worker in this process:
// every event is applied exactly once.
func TestCrashPoints(t *testing.T) {
	t.Parallel()
	points := []txhooktest.CrashPoint{
		txhooktest.CrashInboxAfterFetch, txhooktest.CrashInboxAfterHandler,
		txhooktest.CrashInboxBeforeCommit, txhooktest.CrashInboxAfterCommit,
	}
	s := crashEachPoint(t, points, false, func(s setup) { s.routes.Inbox("github", "push", apply) })
	for _, p := range points {
		t.Run(string(p), func(t *testing.T) {
			key := crashKey(p)
			rec := s.waitStatus(t, key, txhook.StatusDone)
			s.waitJobState(t, rec.JobID, string(rivertype.JobStateCompleted))
			if n := s.applied(t, key); n != 1 {
				t.Fatalf("applied %d times after a crash at %s, want 1", n, p)
			}
			s.checkAttempts(t, rec, p == txhooktest.CrashInboxAfterCommit)
		})
	}
}

// checkAttempts checks that the event's attempts is the number of River's
// try that applied it: the job's attempt, or the one before when the dead
// worker's try had applied it (appliedEarlier) and River's next run of the
// job only found it done.
func (s setup) checkAttempts(t *testing.T, rec txhook.EventRecord, appliedEarlier bool) {
	t.Helper()
	_, attempt := s.job(t, rec.JobID)
	want := attempt
	if appliedEarlier {
		want--
	}
	if rec.Attempts != want {
		t.Errorf("event attempts = %d, River's job at attempt %d: want %d", rec.Attempts, attempt, want)
	}
}

// TestLeaseCrashPoints is TestCrashPoints for a lease route: a worker
// process exits at the inbox's fetch and at each of lease mode's crash
// points, then a worker in this process takes the event over once the dead
// worker's lease has ended. Every event is applied exactly once, and every
// external call, one more after each takeover of work already done, carries
// the event's idempotency key under a claim of its own.
func TestLeaseCrashPoints(t *testing.T) {
	t.Parallel()
	points := []txhooktest.CrashPoint{
		txhooktest.CrashInboxAfterFetch, txhooktest.CrashLeaseAfterClaim, txhooktest.CrashLeaseAfterExternal,
		txhooktest.CrashLeaseBeforeCommit, txhooktest.CrashLeaseAfterCommit,
	}
	// External calls at least: the dead worker's and the takeover's.
	minCalls := map[txhooktest.CrashPoint]int{
		txhooktest.CrashInboxAfterFetch: 1, txhooktest.CrashLeaseAfterClaim: 1, txhooktest.CrashLeaseAfterExternal: 2,
		txhooktest.CrashLeaseBeforeCommit: 2, txhooktest.CrashLeaseAfterCommit: 1,
	}
	s := crashEachPoint(t, points, true, func(s setup) {
		if _, err := s.db.Pool.Exec(t.Context(), externalCallsTable); err != nil {
			t.Fatal(err)
		}
		s.routes.InboxLease("github", "lease", notify(s.db.Pool))
	})
	for _, p := range points {
		t.Run(string(p), func(t *testing.T) {
			key := crashKey(p)
			rec := s.waitStatus(t, key, txhook.StatusDone)
			s.waitJobState(t, rec.JobID, string(rivertype.JobStateCompleted))
			if n := s.applied(t, key); n != 1 {
				t.Fatalf("applied %d times after a crash at %s, want 1", n, p)
			}
			rows, err := s.db.Pool.Query(t.Context(),
				`SELECT idempotency_key, token FROM external_calls WHERE event_key = $1 ORDER BY token`, key)
			if err != nil {
				t.Fatal(err)
			}
			type call struct {
				key   string
				token int
			}
			calls, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (call, error) {
				var c call
				err := r.Scan(&c.key, &c.token)
				return c, err
			})
			if err != nil {
				t.Fatal(err)
			}
			s.checkAttempts(t, rec, p == txhooktest.CrashLeaseAfterCommit)
			if len(calls) < minCalls[p] {
				t.Fatalf("external calls = %v, want at least %d after a crash at %s", calls, minCalls[p], p)
			}
			want := txhook.IdempotencyKey("github", key, "notify")
			for i, c := range calls {
				if c.key != want {
					t.Errorf("external call %d: idempotency key %q, want the event's %q", i, c.key, want)
				}
				if i > 0 && c.token == calls[i-1].token {
					t.Errorf("external calls %d and %d under the same fencing token %d", i-1, i, c.token)
				}
			}
		})
	}
}

// crashKey is the key of the event crashEachPoint sends to crash point p;
// crashQueue is the River queue of its job.
func crashKey(p txhooktest.CrashPoint) string   { return "d-" + string(p) }
func crashQueue(p txhooktest.CrashPoint) string { return "crash-" + string(p) }

// crashEachPoint sets up a database for the crash tests and calls prepare
// (which registers the route's handler on s.ib). For each point in turn it
// accepts an event (crashKey; of type push, or lease when lease is set) into a
// River queue of the point's own and runs a worker process on that queue
// alone, armed to exit at the point, so that each process takes its own
// event and no other. Then it starts s's worker, which runs every queue,
// and returns s: the caller waits for the events and checks them. River
// rescues the dead workers' jobs once this process leads (after the last
// dead leader's term has run out) and they are older than
// RescueStuckJobsAfter: the events are then applied together, in about the
// time one of them takes.
func crashEachPoint(t *testing.T, points []txhooktest.CrashPoint, lease bool, prepare func(s setup)) setup {
	t.Helper()
	rc := riverConfig()
	rc.Queues = make(map[string]river.QueueConfig, len(points))
	for _, p := range points {
		rc.Queues[crashQueue(p)] = river.QueueConfig{MaxWorkers: 2}
	}
	s := newSetup(t, &inbox.Config{River: rc})
	prepare(s)
	for _, p := range points {
		// An inbox that is never started, to insert the job into the
		// point's queue.
		typ := "push"
		if lease {
			typ = "lease"
		}
		res, err := s.acceptor(t, crashQueue(p)).Deliver(t.Context(), txhook.Event{Source: "github", Key: crashKey(p), Type: typ}, nil)
		if err != nil || res.Outcome != txhook.OutcomeQueued {
			t.Fatalf("Accept = %v, %v", res.Outcome, err)
		}
		s.crashWorker(t, p)
	}
	s.start(t)
	return s
}

// crashLease is the lease of notify's claims: short, so that a takeover
// after a dead worker waits little.
const crashLease = time.Second

// externalCallsTable records notify's external calls. Tests that run notify
// create it in their database.
const externalCallsTable = `CREATE TABLE external_calls (
	id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	event_key text NOT NULL,
	idempotency_key text NOT NULL,
	token integer NOT NULL)`

// notify is the tests' lease-mode handler. Phase one makes the external
// call: a row in external_calls, committed on its own, with the claim's
// idempotency key and fencing token. Phase two is apply.
func notify(pool *pgxpool.Pool) txhook.LeaseHandler {
	return txhook.LeaseHandler{
		Lease: crashLease,
		Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
			if _, err := pool.Exec(ctx, `INSERT INTO external_calls (event_key, idempotency_key, token) VALUES ($1, $2, $3)`,
				ev.Key, c.IdempotencyKey("notify"), c.Token); err != nil {
				return nil, fmt.Errorf("external call: %w", err)
			}
			return func(ctx context.Context, tx pgx.Tx) error { return apply(ctx, tx, ev) }, nil
		},
	}
}

// crashWorker runs a worker process (runChild) on s's database and the
// queue crashQueue(p), armed to exit at p, and fails t unless it exits so.
func (s setup) crashWorker(t *testing.T, p txhooktest.CrashPoint) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+s.db.URL, childQueueEnv+"="+crashQueue(p), txhooktest.CrashPointEnv+"="+string(p))
	out, err := cmd.CombinedOutput()
	if ee, ok := errors.AsType[*exec.ExitError](err); !ok || ee.ExitCode() != txhooktest.CrashExitCode {
		t.Fatalf("worker exited with %v, want exit %d at %s; output:\n%s", err, txhooktest.CrashExitCode, p, out)
	}
}

// runChild is the crashing worker: it runs the inbox on the queue named by
// childQueueEnv, with apply on the push route and notify on the lease
// route (type lease), until the armed crash point ends the process, or gives up
// after 30s.
func runChild(url string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	routes := txhook.NewRoutes()
	routes.Inbox("github", "push", apply)
	routes.InboxLease("github", "lease", notify(pool))
	proc, err := txhook.NewProcessor(pool, &txhook.Config{Routes: routes})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ib, err := inbox.New(pool, proc, &inbox.Config{Queue: os.Getenv(childQueueEnv), River: riverConfig()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := ib.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	<-ctx.Done()
	fmt.Fprintln(os.Stderr, "no crash point reached within 30s")
	return 2
}

// TestStopDrainsRunningJob: Stop waits for a running job to finish its
// apply before it returns.
func TestStopDrainsRunningJob(t *testing.T) {
	t.Parallel()
	s := newSetup(t, nil)
	started := make(chan struct{})
	s.routes.Inbox("github", "push", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		close(started)
		time.Sleep(300 * time.Millisecond)
		return apply(ctx, tx, ev)
	})
	if _, err := s.accept(t, txhook.Event{Source: "github", Key: "d-1", Type: "push"}); err != nil {
		t.Fatal(err)
	}
	if err := s.ib.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.ib.Stop(ctx) // stopped already unless the test failed early
	})
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the job did not start within 30s")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := s.ib.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	rec, err := txhook.GetEventRecord(t.Context(), s.db.Pool, "github", "d-1")
	if err != nil || rec.Status != txhook.StatusDone || s.applied(t, "d-1") != 1 {
		t.Fatalf("after Stop: %+v, %v; want the running job's event applied once", rec, err)
	}
}

// TestMigrateOnFreshDatabase: on an empty database, the two documented
// calls (txhook's migrations, then inbox.Migrate) give a schema on which an
// event is accepted and applied. The template runs them too, but only when
// it is built, not on every run.
func TestMigrateOnFreshDatabase(t *testing.T) {
	t.Parallel()
	d := testdb.New(t, testdb.Template{
		Name:    "empty",
		Migrate: func(context.Context, string) error { return nil },
	})
	var tables int
	if err := d.Pool.QueryRow(t.Context(),
		`SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')`).Scan(&tables); err != nil || tables != 0 {
		t.Fatalf("fresh database has %d tables (%v), want none", tables, err)
	}
	if err := migrations.Up(t.Context(), d.URL); err != nil {
		t.Fatalf("txhook's migrations on a fresh database: %v", err)
	}
	if err := inbox.Migrate(t.Context(), d.Pool); err != nil {
		t.Fatalf("Migrate on a fresh database: %v", err)
	}
	if _, err := d.Pool.Exec(t.Context(), `CREATE TABLE applied (key text PRIMARY KEY, n integer NOT NULL DEFAULT 1)`); err != nil {
		t.Fatal(err)
	}
	s := newSetupOn(t, d, nil)
	s.routes.Inbox("github", "push", apply)
	if res, err := s.accept(t, txhook.Event{Source: "github", Key: "d-1", Type: "push"}); err != nil || res.Outcome != txhook.OutcomeQueued {
		t.Fatalf("Accept = %v, %v; want queued", res.Outcome, err)
	}
	s.start(t)
	rec := s.waitStatus(t, "d-1", txhook.StatusDone)
	s.waitJobState(t, rec.JobID, string(rivertype.JobStateCompleted))
	if n := s.applied(t, "d-1"); n != 1 {
		t.Fatalf("applied %d times, want 1", n)
	}
}

// TestMigrateOnDatabaseRunningRiver: River's migrations apply on a database
// that already has them.
func TestMigrateOnDatabaseRunningRiver(t *testing.T) {
	t.Parallel()
	s := newSetup(t, nil)
	if err := inbox.Migrate(t.Context(), s.db.Pool); err != nil {
		t.Fatalf("Migrate on a database running River: %v", err)
	}
	var n int
	if err := s.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM river_migration`).Scan(&n); err != nil || n == 0 {
		t.Fatalf("river_migration rows = %d, %v", n, err)
	}
}
