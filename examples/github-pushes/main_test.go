package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	examplemigrations "github.com/txhook/txhook/examples/github-pushes/migrations"
	"github.com/txhook/txhook/examples/github-pushes/pushesdb"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/inbox"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/migrations"
	"github.com/txhook/txhook/txhooktest"
)

// runMainEnv makes the test binary run the example's main instead of the
// tests, for the process tests.
const runMainEnv = "GITHUB_PUSHES_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	testdb.Main(m)
}

var template = testdb.Template{
	Name:  "github_pushes_inbox",
	Files: []fs.FS{migrations.FS, examplemigrations.FS},
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
		return examplemigrations.Up(ctx, url)
	},
}

const testSecret = "github-test-secret"

type fixture struct {
	db  *testdb.DB
	q   *pushesdb.Queries
	url string
	ib  *inbox.Inbox // nil in sync mode
}

// setup serves the example's handler in inbox mode (its River workers
// running), or with sync in sync mode.
func setup(t *testing.T, sync bool) *fixture {
	t.Helper()
	f := newFixture(t, config{Sync: sync})
	if f.ib != nil {
		f.start(t)
	}
	return f
}

// newFixture serves the example's handler with cfg (its database, secret
// and job timeout set here); in inbox mode, River's workers are not started
// (start): deliveries are accepted, and wait.
func newFixture(t *testing.T, cfg config) *fixture {
	t.Helper()
	tdb := testdb.New(t, template)
	cfg.DatabaseURL, cfg.WebhookSecret, cfg.JobTimeout = tdb.URL, []string{testSecret}, inbox.DefaultJobTimeout
	h, ib, err := newHandler(tdb.Pool, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &fixture{db: tdb, q: pushesdb.New(tdb.Pool), url: srv.URL + "/webhooks/github", ib: ib}
}

// start starts the inbox's River workers, stopped when the test ends.
func (f *fixture) start(t *testing.T) {
	t.Helper()
	if err := f.ib.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := f.ib.Stop(ctx); err != nil {
			t.Errorf("stop inbox: %v", err)
		}
	})
}

func pushBody(t *testing.T, after string, commits int) []byte {
	t.Helper()
	cs := make([]map[string]any, commits)
	for i := range cs {
		cs[i] = map[string]any{"id": after, "message": "change"}
	}
	b, err := json.Marshal(map[string]any{
		"ref": "refs/heads/main", "before": "0000000", "after": after,
		"repository": map[string]any{"full_name": "octo/hello"},
		"pusher":     map[string]any{"name": "octocat"},
		"commits":    cs,
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// deliver POSTs body as GitHub would and returns the status and the answer's
// "status" (or "error") field.
func (f *fixture) deliver(t *testing.T, delivery, event, secret string, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, f.url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(handler.GitHubDeliveryHeader, delivery)
	req.Header.Set(handler.GitHubEventHeader, event)
	if err := (&handler.GitHub{Secrets: []string{secret}}).Sign(req.Header, body, time.Now()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct{ Status, Error string }
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, v.Status + v.Error
}

func want(t *testing.T, gotStatus int, gotOutcome string, wantStatus int, wantOutcome string) {
	t.Helper()
	if gotStatus != wantStatus || gotOutcome != wantOutcome {
		t.Fatalf("answer = %d %q, want %d %q", gotStatus, gotOutcome, wantStatus, wantOutcome)
	}
}

func (f *fixture) repo(t *testing.T) pushesdb.Repository {
	t.Helper()
	r, err := f.q.GetRepository(t.Context(), "octo/hello")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// waitStatus waits up to 60s for the delivery's row to reach status.
func (f *fixture) waitStatus(t *testing.T, delivery string, status txhook.Status) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		rec, err := txhook.GetEventRecord(t.Context(), f.db.Pool, "github", delivery)
		if err == nil && rec.Status == status {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("delivery %s: status %q (%v) after 60s, want %q", delivery, rec.Status, err, status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (f *fixture) rows(t *testing.T) int {
	t.Helper()
	var n int
	err := f.db.Pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM pushes)
		+ (SELECT count(*) FROM repositories) + (SELECT count(*) FROM txhook_processed_events)`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestPushRecordedOnce(t *testing.T) {
	t.Parallel()
	for _, sync := range []bool{false, true} {
		t.Run(map[bool]string{false: "inbox", true: "sync"}[sync], func(t *testing.T) {
			t.Parallel()
			testPushRecordedOnce(t, sync)
		})
	}
}

func testPushRecordedOnce(t *testing.T, sync bool) {
	f := setup(t, sync)
	status, outcome := 202, "queued"
	if sync {
		status, outcome = 200, "processed"
	}
	s, o := f.deliver(t, "d-1", "push", testSecret, pushBody(t, "aaa111", 2))
	want(t, s, o, status, outcome)
	// A redelivery keeps X-GitHub-Delivery: a duplicate.
	s, o = f.deliver(t, "d-1", "push", testSecret, pushBody(t, "aaa111", 2))
	want(t, s, o, 200, "duplicate")
	// Queued pushes are applied in any order: d-1 first, so that the head
	// is d-2's.
	f.waitStatus(t, "d-1", txhook.StatusDone)
	s, o = f.deliver(t, "d-2", "push", testSecret, pushBody(t, "bbb222", 3))
	want(t, s, o, status, outcome)
	f.waitStatus(t, "d-2", txhook.StatusDone)

	r := f.repo(t)
	if r.PushCount != 2 || r.CommitCount != 5 || r.LastHeadSha != "bbb222" {
		t.Fatalf("repository = %+v, want 2 pushes, 5 commits, head bbb222", r)
	}
	ps, err := f.q.ListPushes(t.Context(), "octo/hello")
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 || ps[0].DeliveryID != "d-1" || ps[0].Pusher != "octocat" || ps[1].CommitCount != 3 {
		t.Fatalf("pushes = %+v", ps)
	}
}

func TestReplayedBodyUnderNewDeliveryID(t *testing.T) {
	t.Parallel()
	f := setup(t, false)
	body := pushBody(t, "ccc333", 1)
	s, o := f.deliver(t, "d-orig", "push", testSecret, body)
	want(t, s, o, 202, "queued")
	// A captured body and signature sent again with a fresh delivery id.
	s, o = f.deliver(t, "d-forged", "push", testSecret, body)
	want(t, s, o, 200, "duplicate_body")
	f.waitStatus(t, "d-orig", txhook.StatusDone)
	if r := f.repo(t); r.PushCount != 1 {
		t.Fatalf("push_count = %d after a replay, want 1", r.PushCount)
	}
}

func TestPingOtherTypesAndRejects(t *testing.T) {
	t.Parallel()
	f := setup(t, false)
	s, o := f.deliver(t, "d-ping", "ping", testSecret, []byte(`{"zen":"Keep it logically awesome."}`))
	want(t, s, o, 200, "ping")
	s, o = f.deliver(t, "d-issue", "issues", testSecret, []byte(`{"action":"opened"}`))
	want(t, s, o, 200, "ignored")
	s, o = f.deliver(t, "d-bad", "push", "wrong-secret", pushBody(t, "ddd444", 1))
	want(t, s, o, 400, "bad_signature")
	// The body dedupe records the ping's and the ignored delivery's keys
	// and body hashes, so that neither body can come back as a push; no
	// business row is written.
	if n := f.rows(t); n != 2 {
		t.Fatalf("%d rows written, want the 2 recorded keys", n)
	}
	// A signed push without a repository can never be applied: accepted,
	// then recorded as failed by its job (with its body, for replay).
	s, o = f.deliver(t, "d-broken", "push", testSecret, []byte(`{"ref":"refs/heads/main"}`))
	want(t, s, o, 202, "queued")
	f.waitStatus(t, "d-broken", txhook.StatusFailed)
	var status string
	if err := f.db.Pool.QueryRow(t.Context(),
		"SELECT status FROM txhook_processed_events WHERE source = 'github' AND event_key = 'd-broken' AND payload IS NOT NULL").Scan(&status); err != nil {
		t.Fatal(err)
	}
	if status != "failed" {
		t.Fatalf("status = %q, want failed", status)
	}
}

func TestProcessCrashThenRedelivery(t *testing.T) {
	t.Parallel()
	tdb := testdb.New(t, template)
	f := &fixture{db: tdb, q: pushesdb.New(tdb.Pool)}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	start := func(extra ...string) (*exec.Cmd, *bytes.Buffer, string) {
		t.Helper()
		addr := freeAddr(t)
		var stderr bytes.Buffer
		cmd := exec.Command(exe)
		cmd.Env = append([]string{runMainEnv + "=1", "DATABASE_URL=" + tdb.URL,
			"GITHUB_WEBHOOK_SECRET=" + testSecret, "ADDR=" + addr, "APPLY_MODE=sync"}, extra...)
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		waitListening(t, addr)
		return cmd, &stderr, addr
	}
	body := pushBody(t, "eee555", 4)

	cmd, stderr, addr := start(txhooktest.CrashPointEnv + "=" + string(txhooktest.CrashBeforeCommit))
	f.url = "http://" + addr + "/webhooks/github"
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.url, bytes.NewReader(body))
	req.Header.Set(handler.GitHubDeliveryHeader, "d-crash")
	req.Header.Set(handler.GitHubEventHeader, "push")
	_ = (&handler.GitHub{Secrets: []string{testSecret}}).Sign(req.Header, body, time.Now())
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("got %s, want no answer", resp.Status)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err = <-exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("the example did not exit at the crash point:\n%s", stderr)
	}
	if ee, ok := errors.AsType[*exec.ExitError](err); !ok || ee.ExitCode() != txhooktest.CrashExitCode {
		t.Fatalf("exit = %v, want status %d:\n%s", err, txhooktest.CrashExitCode, stderr)
	}
	if n := f.rows(t); n != 0 {
		t.Fatalf("%d rows after a crash before COMMIT, want 0", n)
	}

	// GitHub does not retry by itself: an operator redelivers, same id.
	_, _, addr = start()
	f.url = "http://" + addr + "/webhooks/github"
	s, o := f.deliver(t, "d-crash", "push", testSecret, body)
	want(t, s, o, 200, "processed")
	if r := f.repo(t); r.PushCount != 1 || r.CommitCount != 4 {
		t.Fatalf("repository = %+v, want 1 push of 4 commits", r)
	}
}

func TestLoadConfig(t *testing.T) {
	t.Parallel()
	_, err := loadConfig(func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "DATABASE_URL is required") || !strings.Contains(err.Error(), "GITHUB_WEBHOOK_SECRET is required") {
		t.Fatalf("err = %v, want both required settings named", err)
	}
	env := map[string]string{"DATABASE_URL": "postgres://x", "GITHUB_WEBHOOK_SECRET": "a, b"}
	c, err := loadConfig(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if c.Addr != "127.0.0.1:8081" || len(c.WebhookSecret) != 2 || c.WebhookSecret[1] != "b" {
		t.Fatalf("config = %+v", c)
	}
}

func TestProcessMissingSettingsExitNonZero(t *testing.T) {
	t.Parallel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), exe)
	cmd.Env = []string{runMainEnv + "=1"}
	out, err := cmd.CombinedOutput()
	if ee, ok := errors.AsType[*exec.ExitError](err); !ok || ee.ExitCode() == 0 {
		t.Fatalf("err = %v, want a non-zero exit", err)
	}
	if !strings.Contains(string(out), "GITHUB_WEBHOOK_SECRET is required") {
		t.Fatalf("output:\n%s", out)
	}
}

// TestInboxProcessKilledMidJob: GitHub delivers a push once; the process
// accepts it (202) and dies in the middle of its job, after the handler and
// before COMMIT. Nobody redelivers: the restarted process's River workers
// rescue the job and apply the push exactly once.
func TestInboxProcessKilledMidJob(t *testing.T) {
	t.Parallel()
	tdb := testdb.New(t, template)
	f := &fixture{db: tdb, q: pushesdb.New(tdb.Pool)}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	start := func(extra ...string) *exec.Cmd {
		t.Helper()
		addr := freeAddr(t)
		cmd := exec.Command(exe)
		cmd.Env = append([]string{runMainEnv + "=1", "DATABASE_URL=" + tdb.URL,
			"GITHUB_WEBHOOK_SECRET=" + testSecret, "ADDR=" + addr, "INBOX_JOB_TIMEOUT=1s"}, extra...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		waitListening(t, addr)
		f.url = "http://" + addr + "/webhooks/github"
		return cmd
	}
	// The job's try waits TRY_DELAY first, so that the 202 is out before the
	// process dies: the job is fetched as soon as the accept commits and can
	// otherwise reach its crash point before the answer is written.
	cmd := start(txhooktest.CrashPointEnv+"="+string(txhooktest.CrashInboxBeforeCommit), "TRY_DELAY=300ms")
	s, o := f.deliver(t, "d-mid-job", "push", testSecret, pushBody(t, "fff666", 2))
	want(t, s, o, 202, "queued")
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err = <-exited:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("the process did not reach its crash point within 60s")
	}
	if ee, ok := errors.AsType[*exec.ExitError](err); !ok || ee.ExitCode() != txhooktest.CrashExitCode {
		t.Fatalf("exit = %v, want status %d", err, txhooktest.CrashExitCode)
	}
	rec, err := txhook.GetEventRecord(t.Context(), tdb.Pool, "github", "d-mid-job")
	if err != nil || rec.Status != txhook.StatusQueued {
		t.Fatalf("after the crash: %+v, %v; want the push still queued", rec, err)
	}
	start()
	f.waitStatus(t, "d-mid-job", txhook.StatusDone)
	if r := f.repo(t); r.PushCount != 1 || r.CommitCount != 2 {
		t.Fatalf("repository = %+v, want 1 push of 2 commits", r)
	}
}
