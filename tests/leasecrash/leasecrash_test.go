// Package leasecrash proves lease mode's claim with real process deaths. A
// child process applies an event whose handler calls an external API (a
// local HTTP server counting calls per Idempotency-Key) and then writes
// business rows; the child dies (os.Exit at a lease crash point) after the
// claim, after the external call, before the final COMMIT, or after it. A
// restarted child then redelivers until the dead worker's lease ends and the
// event is taken over: the business effect exists exactly once and every
// external call carried the same idempotency key. A last test kills the
// worker with SIGKILL in the middle of its external call, after renewals have
// kept its claim alive for several leases.
package leasecrash

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/db"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/txhooktest"
)

// Environment of the child mode of this test binary.
const (
	childEnv = "TXHOOK_LEASECRASH_CHILD" // set: run as a child worker
	dbEnv    = "TXHOOK_LEASECRASH_DATABASE_URL"
	apiEnv   = "TXHOOK_LEASECRASH_API_URL"
)

// lease is short so that a dead worker's claim ends quickly.
const lease = 500 * time.Millisecond

var testEvent = txhook.Event{Source: "lease-crash", Key: "evt_lease_crash", Type: "invoice.paid"}

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(child())
	}
	testdb.Main(m)
}

// schema is the business side: an invoice row and a running total that is
// not idempotent on its own (applying the event twice doubles it).
const schema = `
CREATE TABLE invoices (id text PRIMARY KEY, charged bigint NOT NULL);
CREATE TABLE totals (customer text PRIMARY KEY, charged bigint NOT NULL);`

// child processes testEvent once in lease mode and prints its outcome.
// TXHOOK_CRASH_POINT makes it die on the way.
func child() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(dbEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	p, err := txhook.NewProcessor(pool, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	api := os.Getenv(apiEnv)
	res, err := p.ProcessLease(ctx, testEvent, txhook.LeaseHandler{
		Lease: lease,
		Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
			if err := charge(ctx, api, c.IdempotencyKey("charge")); err != nil {
				return nil, err
			}
			return func(ctx context.Context, tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, "INSERT INTO invoices (id, charged) VALUES ($1, 500)", "inv-"+ev.Key); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `INSERT INTO totals (customer, charged) VALUES ('cus_1', 500)
					ON CONFLICT (customer) DO UPDATE SET charged = totals.charged + 500`)
				return err
			}, nil
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(res.Outcome)
	return 0
}

func charge(ctx context.Context, api, key string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, api+"/v1/charges", strings.NewReader("amount=500"))
	if err != nil {
		return err
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("charge: status %d", resp.StatusCode)
	}
	return nil
}

// externalAPI stands in for a payment provider: it records the
// Idempotency-Key of every request.
type externalAPI struct {
	srv  *httptest.Server
	mu   sync.Mutex
	keys []string
}

func newExternalAPI(t *testing.T) *externalAPI {
	a := &externalAPI{}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.keys = append(a.keys, r.Header.Get("Idempotency-Key"))
		a.mu.Unlock()
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *externalAPI) calls() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.keys...)
}

// childCmd returns the command running a child; crashAt arms a crash point.
func childCmd(t *testing.T, dbURL, apiURL string, crashAt txhooktest.CrashPoint) *exec.Cmd {
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		childEnv+"=1", dbEnv+"="+dbURL, apiEnv+"="+apiURL,
		txhooktest.CrashPointEnv+"="+string(crashAt))
	return cmd
}

// run runs a child; crashAt arms a crash point. It returns the child's
// printed outcome, or its exit code when it did not exit 0.
func run(t *testing.T, dbURL, apiURL string, crashAt txhooktest.CrashPoint) (outcome string, code int) {
	t.Helper()
	cmd := childCmd(t, dbURL, apiURL, crashAt)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if exitErr, ok := errors.AsType[*exec.ExitError](err); ok {
		return "", exitErr.ExitCode()
	}
	if err != nil {
		t.Fatalf("run child: %v", err)
	}
	return strings.TrimSpace(stdout.String()), 0
}

func TestCrashThenRedeliveryAppliesOnce(t *testing.T) {
	t.Parallel()
	wantKey := txhook.IdempotencyKey(testEvent.Source, testEvent.Key, "charge")
	for _, tc := range []struct {
		point txhooktest.CrashPoint
		// committed: the crash came after COMMIT, so the redelivery is a
		// duplicate of the dead worker's completed event.
		committed bool
		// calls made to the external API by the time the event is done.
		calls int
	}{
		{txhooktest.CrashLeaseAfterClaim, false, 1},
		{txhooktest.CrashLeaseAfterExternal, false, 2},
		{txhooktest.CrashLeaseBeforeCommit, false, 2},
		{txhooktest.CrashLeaseAfterCommit, true, 1},
	} {
		t.Run(string(tc.point), func(t *testing.T) {
			t.Parallel()
			d := testdb.New(t)
			if _, err := d.Pool.Exec(t.Context(), schema); err != nil {
				t.Fatal(err)
			}
			api := newExternalAPI(t)

			crashStart := time.Now()
			if out, code := run(t, d.URL, api.srv.URL, tc.point); code != txhooktest.CrashExitCode {
				t.Fatalf("crashing child: outcome %q, exit %d; want exit %d", out, code, txhooktest.CrashExitCode)
			}
			row := getRow(t, d.Pool)
			wantStatus := "in_progress"
			if tc.committed {
				wantStatus = "done"
			}
			if row.Status != wantStatus || row.Attempts != 1 {
				t.Fatalf("after the crash: status %s, attempts %d; want %s, 1", row.Status, row.Attempts, wantStatus)
			}
			if n := count(t, d.Pool, "SELECT count(*) FROM invoices"); tc.committed != (n == 1) {
				t.Fatalf("after the crash: %d invoices", n)
			}

			// Restart and redeliver, as the provider does, until the event
			// is done.
			inFlight := 0
			final := ""
			for deadline := time.Now().Add(time.Minute); final == ""; {
				out, code := run(t, d.URL, api.srv.URL, "")
				switch {
				case code != 0:
					t.Fatalf("redelivery: exit %d", code)
				case out == txhook.OutcomeInFlight.String():
					inFlight++
					if time.Now().After(deadline) {
						t.Fatal("event still in flight a minute after the crash")
					}
					time.Sleep(50 * time.Millisecond)
				case time.Since(crashStart) < lease && !tc.committed:
					// The dead worker's lease cannot have ended yet.
					t.Fatalf("redelivery answered %q within the dead worker's lease", out)
				default:
					final = out
				}
			}
			want := txhook.OutcomeProcessed.String()
			if tc.committed {
				want = txhook.OutcomeDuplicate.String()
			}
			if final != want {
				t.Errorf("redelivery = %q, want %q", final, want)
			}
			if out, code := run(t, d.URL, api.srv.URL, ""); code != 0 || out != txhook.OutcomeDuplicate.String() {
				t.Errorf("last redelivery = %q (exit %d), want duplicate", out, code)
			}

			if n := count(t, d.Pool, "SELECT count(*) FROM invoices"); n != 1 {
				t.Errorf("invoices = %d, want 1", n)
			}
			if n := count(t, d.Pool, "SELECT coalesce(sum(charged), 0)::bigint FROM totals"); n != 500 {
				t.Errorf("total charged = %d, want 500 (once)", n)
			}
			row = getRow(t, d.Pool)
			wantAttempts := int32(2)
			if tc.committed {
				wantAttempts = 1
			}
			if row.Status != "done" || row.Attempts != wantAttempts {
				t.Errorf("row: status %s, attempts %d; want done, %d", row.Status, row.Attempts, wantAttempts)
			}
			calls := api.calls()
			if len(calls) != tc.calls {
				t.Errorf("external calls = %d, want %d", len(calls), tc.calls)
			}
			for i, k := range calls {
				if k != wantKey {
					t.Errorf("external call %d carried Idempotency-Key %q, want %q", i, k, wantKey)
				}
			}
			t.Logf("crash at %s: %d in-flight answers, then the final one; %d external calls, one effect",
				tc.point, inFlight, len(calls))
		})
	}
}

func getRow(t *testing.T, pool *pgxpool.Pool) db.TxhookProcessedEvent {
	t.Helper()
	r, err := db.New(pool).GetEvent(t.Context(), db.GetEventParams{Source: testEvent.Source, EventKey: testEvent.Key})
	if err != nil {
		t.Fatalf("get event: %v", err)
	}
	return r
}

func count(t *testing.T, pool *pgxpool.Pool, sql string) int {
	t.Helper()
	var n int64
	if err := pool.QueryRow(t.Context(), sql).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return int(n)
}

// TestKilledDuringExternalCall kills the worker (SIGKILL) while its external
// call is in flight, after it has held its claim for several leases through
// renewals. Its renewals stop with it, the claim ends one lease later, and
// the redelivery takes the event over: the call is repeated with the same
// idempotency key and the business effect exists once.
func TestKilledDuringExternalCall(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	if _, err := d.Pool.Exec(t.Context(), schema); err != nil {
		t.Fatal(err)
	}
	api := newExternalAPI(t)
	inCall, killed := make(chan struct{}), make(chan struct{})
	var first sync.Once
	blocking := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		api.srv.Config.Handler.ServeHTTP(w, r)
		isFirst := false
		first.Do(func() { isFirst = true })
		if isFirst {
			close(inCall)
			<-killed // the call hangs until the worker is dead
		}
	}))
	t.Cleanup(blocking.Close)
	var freeCall sync.Once
	endCall := func() { freeCall.Do(func() { close(killed) }) }
	t.Cleanup(endCall) // before the server waits for the call, should the test fail first

	cmd := childCmd(t, d.URL, blocking.URL, "")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-inCall:
	case <-time.After(time.Minute):
		t.Fatal("worker did not call the external API")
	}
	// Hold the call open for more than two leases: renewals must keep the
	// claim alive across them.
	var renewed bool
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		var held time.Duration
		err := d.Pool.QueryRow(t.Context(), `SELECT clock_timestamp() - claimed_at, lease_expires_at > clock_timestamp()
			FROM txhook_processed_events WHERE source = $1 AND event_key = $2`,
			testEvent.Source, testEvent.Key).Scan(&held, &renewed)
		if err != nil {
			t.Fatal(err)
		}
		if !renewed {
			t.Fatalf("claim held for %v lost its lease while the worker was alive", held)
		}
		if held > 2*lease {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("claim not held long enough")
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	endCall()
	if err == nil {
		t.Fatal("killed worker exited cleanly")
	}

	final := ""
	for deadline := time.Now().Add(time.Minute); final == ""; {
		out, code := run(t, d.URL, api.srv.URL, "")
		switch {
		case code != 0:
			t.Fatalf("redelivery: exit %d", code)
		case out != txhook.OutcomeInFlight.String():
			final = out
		case time.Now().After(deadline):
			t.Fatal("event still in flight a minute after the kill")
		default:
			time.Sleep(50 * time.Millisecond)
		}
	}
	if final != txhook.OutcomeProcessed.String() {
		t.Errorf("redelivery = %q, want processed", final)
	}
	if n := count(t, d.Pool, "SELECT count(*) FROM invoices"); n != 1 {
		t.Errorf("invoices = %d, want 1", n)
	}
	if row := getRow(t, d.Pool); row.Status != "done" || row.Attempts != 2 {
		t.Errorf("row: status %s, attempts %d; want done, 2", row.Status, row.Attempts)
	}
	wantKey := txhook.IdempotencyKey(testEvent.Source, testEvent.Key, "charge")
	calls := api.calls()
	if len(calls) != 2 || calls[0] != wantKey || calls[1] != wantKey {
		t.Errorf("external calls = %q, want two with %q", calls, wantKey)
	}
}
