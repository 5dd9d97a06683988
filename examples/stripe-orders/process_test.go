package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/examples/stripe-orders/ordersdb"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/txhooktest"
)

// Process tests run the example as a real process (the test binary, with
// runMainEnv set, runs main), so that a crash point is a real process exit.

// proc is the example running as a child process.
type proc struct {
	cmd    *exec.Cmd
	addr   string
	stderr *lockedBuffer
	done   chan struct{}
}

// lockedBuffer collects a child's stderr.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var listeningLine = regexp.MustCompile(`msg=listening addr=(\S+)`)

// command returns the example as a command with exactly env (and PATH),
// killed when ctx ends.
func command(ctx context.Context, t *testing.T, env ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append([]string{runMainEnv + "=1", "PATH=" + os.Getenv("PATH")}, env...)
	return cmd
}

// startProc starts the example and waits for its "listening" log line.
func startProc(t *testing.T, env ...string) *proc {
	t.Helper()
	p := &proc{cmd: command(context.Background(), t, env...), stderr: &lockedBuffer{}, done: make(chan struct{})}
	pr, pw := io.Pipe()
	p.cmd.Stderr = io.MultiWriter(p.stderr, pw)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		pw.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if m := listeningLine.FindStringSubmatch(sc.Text()); m != nil {
				addrc <- m[1]
				break
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	select {
	case p.addr = <-addrc:
		return p
	case <-p.done:
		t.Fatalf("example exited before listening:\n%s", p.stderr)
	case <-time.After(60 * time.Second):
		t.Fatalf("example not listening after 60s:\n%s", p.stderr)
	}
	return nil
}

func (p *proc) url() string { return "http://" + p.addr + "/webhooks/stripe" }

// waitExit waits for the process to exit and returns its exit code.
func (p *proc) waitExit(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("example still running:\n%s", p.stderr)
	}
	return p.cmd.ProcessState.ExitCode()
}

// deliverNoAnswer delivers body and expects the connection to close
// without an answer.
func deliverNoAnswer(t *testing.T, url string, body []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err := (&handler.Stripe{Secrets: []string{testSecret}}).Sign(req.Header, body, time.Now()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got an answer (%s), want none: the process should have crashed", resp.Status)
	}
}

func TestProcessCrashPointsThenRetry(t *testing.T) {
	t.Parallel()
	points := []txhooktest.CrashPoint{txhooktest.CrashAfterInsert, txhooktest.CrashAfterHandler, txhooktest.CrashBeforeCommit, txhooktest.CrashAfterCommit}
	for _, point := range points {
		t.Run(string(point), func(t *testing.T) {
			t.Parallel()
			tdb := testdb.New(t, template)
			f := &fixture{db: tdb}
			env := []string{"DATABASE_URL=" + tdb.URL, "STRIPE_WEBHOOK_SECRET=" + testSecret, "ADDR=127.0.0.1:0"}
			body := checkout(t, "evt_crash", "cs_crash", "cus_crash", 4200)

			p := startProc(t, append(env, txhooktest.CrashPointEnv+"="+string(point))...)
			deliverNoAnswer(t, p.url(), body)
			if code := p.waitExit(t); code != txhooktest.CrashExitCode {
				t.Fatalf("exit code = %d, want %d:\n%s", code, txhooktest.CrashExitCode, p.stderr)
			}
			// A checkout costs the example one round trip, COMMIT
			// included (its writes are deferred): its insert is known
			// only once that round trip has answered, so after-insert
			// comes after COMMIT too.
			afterCommit := point == txhooktest.CrashAfterCommit || point == txhooktest.CrashAfterInsert
			committed := f.count(t, "SELECT count(*) FROM orders")
			if want := map[bool]int{true: 1, false: 0}[afterCommit]; committed != want {
				t.Fatalf("orders after crash at %s = %d, want %d", point, committed, want)
			}

			// Restarted without the crash point, the provider's retry is
			// processed (or found done, when the crash came after COMMIT).
			p = startProc(t, env...)
			s, o := deliver(t, p.url(), testSecret, body)
			want := "processed"
			if afterCommit {
				want = "duplicate"
			}
			wantAnswer(t, s, o, 200, want)
			if n := f.count(t, "SELECT count(*) FROM orders"); n != 1 {
				t.Fatalf("orders = %d, want 1", n)
			}
			if got := f.count(t, "SELECT total_spent::int FROM customers WHERE id = 'cus_crash'"); got != 4200 {
				t.Fatalf("total = %d, want 4200 (exactly once)", got)
			}
		})
	}
}

func TestProcessTwoInstancesMigrateAnEmptyDatabase(t *testing.T) {
	t.Parallel()
	empty := testdb.Template{Name: "empty", Migrate: func(context.Context, string) error { return nil }}
	tdb := testdb.New(t, empty)
	env := []string{"DATABASE_URL=" + tdb.URL, "STRIPE_WEBHOOK_SECRET=" + testSecret, "ADDR=127.0.0.1:0"}
	var wg sync.WaitGroup
	procs := make([]*proc, 2)
	for i := range procs {
		wg.Go(func() { procs[i] = startProc(t, env...) })
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for i, p := range procs {
		s, o := deliver(t, p.url(), testSecret, checkout(t, "evt_"+string(rune('a'+i)), "cs_"+string(rune('a'+i)), "cus_m", 100))
		wantAnswer(t, s, o, 200, "processed")
	}
	f := &fixture{db: tdb}
	if got := f.count(t, "SELECT total_spent::int FROM customers WHERE id = 'cus_m'"); got != 200 {
		t.Fatalf("total = %d, want 200", got)
	}
}

func TestProcessBadSettingsExitNonZero(t *testing.T) {
	t.Parallel()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	unreachable := "postgres://postgres@" + closed.Addr().String() + "/app?sslmode=disable&connect_timeout=5"
	closed.Close()
	cases := []struct {
		name string
		env  []string
		want []string
	}{
		{"nothing set", nil, []string{"DATABASE_URL is required", "STRIPE_WEBHOOK_SECRET is required"}},
		{"no secret", []string{"DATABASE_URL=" + unreachable}, []string{"STRIPE_WEBHOOK_SECRET is required"}},
		{"database unreachable", []string{"DATABASE_URL=" + unreachable, "STRIPE_WEBHOOK_SECRET=whsec_x"}, []string{"connect to the database"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			out, err := command(ctx, t, c.env...).CombinedOutput()
			ee, ok := errors.AsType[*exec.ExitError](err)
			if !ok || ee.ExitCode() == 0 {
				t.Fatalf("err = %v, want a non-zero exit; output:\n%s", err, out)
			}
			for _, w := range c.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("output does not say %q:\n%s", w, out)
				}
			}
		})
	}
}

func TestProcessFulfillmentCrashAfterExternalCall(t *testing.T) {
	t.Parallel()
	svc := &fulfillmentService{calls: map[string]int{}}
	ext := httptest.NewServer(svc)
	t.Cleanup(ext.Close)
	tdb := testdb.New(t, template)
	f := &fixture{db: tdb, q: ordersdb.New(tdb.Pool)}
	env := []string{"DATABASE_URL=" + tdb.URL, "STRIPE_WEBHOOK_SECRET=" + testSecret, "ADDR=127.0.0.1:0",
		"FULFILLMENT_URL=" + ext.URL + "/ship"}
	body := stripeEventBody(t, "evt_pi_crash", "payment_intent.succeeded", map[string]any{"id": "pi_c", "amount": 3100})

	// The process dies after the fulfillment service accepted the request,
	// before the shipment row and the done mark commit.
	p := startProc(t, append(env, txhooktest.CrashPointEnv+"="+string(txhooktest.CrashLeaseAfterExternal))...)
	deliverNoAnswer(t, p.url(), body)
	if code := p.waitExit(t); code != txhooktest.CrashExitCode {
		t.Fatalf("exit code = %d, want %d:\n%s", code, txhooktest.CrashExitCode, p.stderr)
	}

	// While the dead worker's lease runs, a retry is told to come back
	// later: never 200 for an event whose effects are not committed.
	p = startProc(t, env...)
	s, o := deliver(t, p.url(), testSecret, body)
	wantAnswer(t, s, o, 409, "in_flight")
	if n := f.count(t, "SELECT count(*) FROM shipments"); n != 0 {
		t.Fatalf("shipments = %d while the event is in flight", n)
	}

	// Once the lease has run out (here: moved to now), the retry takes the
	// event over and calls the service again with the same Idempotency-Key.
	if _, err := tdb.Pool.Exec(t.Context(),
		"UPDATE txhook_processed_events SET lease_expires_at = now() WHERE event_key = 'evt_pi_crash'"); err != nil {
		t.Fatal(err)
	}
	s, o = deliver(t, p.url(), testSecret, body)
	wantAnswer(t, s, o, 200, "processed")
	key := txhook.IdempotencyKey(source, "evt_pi_crash", fulfillmentStep)
	svc.mu.Lock()
	calls := maps.Clone(svc.calls)
	svc.mu.Unlock()
	if len(calls) != 1 || calls[key] != 2 {
		t.Fatalf("calls by idempotency key = %v, want both calls with %s", calls, key)
	}
	if n := f.count(t, "SELECT count(*) FROM shipments WHERE payment_intent_id = 'pi_c' AND idempotency_key = $1", key); n != 1 {
		t.Fatalf("shipments = %d, want 1", n)
	}
}
