package ghsweep_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook/ghsweep"
	"github.com/txhook/txhook/internal/fakegithub"
	"github.com/txhook/txhook/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

const testToken = "ghp_s3cr3tT0kenThatMustNeverBeLogged42"

// fixture is a fake GitHub API in front of one hook and a migrated database.
type fixture struct {
	pool *pgxpool.Pool
	gh   *fakegithub.Server
	api  *httptest.Server
	logs *syncBuffer
	// wrap, when set, answers instead of the fake.
	mu   sync.Mutex
	wrap func(w http.ResponseWriter, r *http.Request) bool
}

func setup(t *testing.T, ghCfg fakegithub.Config) *fixture {
	t.Helper()
	if ghCfg.Hook == "" {
		ghCfg.Hook = "repos/octo-org/octo-repo/hooks/7"
	}
	if ghCfg.Token == "" && ghCfg.AppKey == nil {
		ghCfg.Token = testToken
	}
	f := &fixture{pool: testdb.New(t).Pool, gh: fakegithub.New(ghCfg), logs: &syncBuffer{}}
	f.api = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		wrap := f.wrap
		f.mu.Unlock()
		if wrap != nil && wrap(w, r) {
			return
		}
		f.gh.ServeHTTP(w, r)
	}))
	t.Cleanup(f.api.Close)
	return f
}

// sweeper returns a sweeper of the repository hook, with edit applied to
// its configuration.
func (f *fixture) sweeper(t *testing.T, edit func(*ghsweep.Config)) *ghsweep.Sweeper {
	t.Helper()
	cfg := &ghsweep.Config{
		Hook:      ghsweep.RepoHook("octo-org", "octo-repo", 7),
		Token:     testToken,
		APIURL:    f.api.URL,
		PostPause: -1,
		Backoff:   time.Millisecond,
		Logger:    slog.New(slog.NewJSONHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if edit != nil {
		edit(cfg)
	}
	s, err := ghsweep.New(f.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// failed records a failed delivery of guid, age ago.
func (f *fixture) failed(guid string, age time.Duration) fakegithub.Delivery {
	return f.gh.Add(fakegithub.Delivery{GUID: guid, Event: "push", StatusCode: 503, DeliveredAt: time.Now().Add(-age).UTC()})
}

// settle records guid in the events table of source "github" with status.
func (f *fixture) settle(t *testing.T, guid, status string) {
	t.Helper()
	_, err := f.pool.Exec(context.Background(), `
		INSERT INTO txhook_processed_events (source, event_key, event_type, status, completed_at, lease_expires_at)
		VALUES ('github', $1, 'push', $2, CASE WHEN $2 = 'in_progress' THEN NULL ELSE now() END,
		        CASE WHEN $2 = 'in_progress' THEN now() - interval '1 minute' END)`, guid, status)
	if err != nil {
		t.Fatal(err)
	}
}

func run(t *testing.T, s *ghsweep.Sweeper) ghsweep.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	res, err := s.Run(ctx)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return res
}

func sorted(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }

// TestSettledSkippedUnknownRedeliveredOnce: of the failed guids, those done
// or failed in the events table are never redelivered, nor one held by a
// live lease; unknown ones, and one held by an expired lease, are
// redelivered once; a guid that a later
// attempt delivered is left alone. A second run requests nothing; a newer
// failed attempt at a guid makes it eligible again.
func TestSettledSkippedUnknownRedeliveredOnce(t *testing.T) {
	t.Parallel()
	f := setup(t, fakegithub.Config{})
	f.failed("settled-done", time.Hour)
	f.failed("settled-failed", time.Hour)
	f.failed("unknown", time.Hour)
	f.failed("unknown", 50*time.Minute) // a second failed attempt: still one redelivery
	f.failed("lease-expired", time.Hour)
	f.failed("recovered", time.Hour)
	f.gh.Add(fakegithub.Delivery{GUID: "recovered", Event: "push", StatusCode: 200, Redelivery: true})
	f.gh.Add(fakegithub.Delivery{GUID: "ok", Event: "push", StatusCode: 200})
	f.settle(t, "settled-done", "done")
	f.settle(t, "settled-failed", "failed")
	f.settle(t, "lease-expired", "in_progress")
	f.failed("lease-live", time.Hour)
	if _, err := f.pool.Exec(t.Context(), `INSERT INTO txhook_processed_events (source, event_key, status, lease_expires_at)
		VALUES ('github', 'lease-live', 'in_progress', now() + interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	s := f.sweeper(t, nil)

	res := run(t, s)
	want := []string{"lease-expired", "unknown"}
	if got := sorted(f.gh.Redeliveries()); !slices.Equal(got, want) {
		t.Fatalf("redelivered %q, want %q", got, want)
	}
	if res.Deliveries != 9 || res.Failed != 5 || res.Settled != 2 || res.InFlight != 1 || len(res.Redelivered) != 2 || res.Waiting != 0 {
		t.Fatalf("result %+v, want 9 deliveries, 5 failed guids, 2 settled, 1 in flight, 2 redelivered", res)
	}

	// Again, from another sweeper: GitHub has made no newer attempt, so
	// both redeliveries are on their way.
	res = run(t, f.sweeper(t, nil))
	if n := len(f.gh.Redeliveries()); n != 2 || res.Waiting != 2 || len(res.Redelivered) != 0 {
		t.Fatalf("second run: %d redeliveries in all, result %+v; want 2 and 2 waiting", n, res)
	}

	// GitHub attempted "unknown" again and the receiver failed again.
	f.failed("unknown", 0)
	res = run(t, s)
	if got := f.gh.Redeliveries(); len(got) != 3 || got[2] != "unknown" || res.Waiting != 1 {
		t.Fatalf("after a newer failed attempt: redelivered %q, result %+v; want unknown a second time", got, res)
	}

	runs, err := ghsweep.ListRuns(t.Context(), f.pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 || runs[0].Hook != "repos/octo-org/octo-repo/hooks/7" || runs[0].TotalRedelivered != 3 ||
		runs[0].FinishedAt.IsZero() || runs[0].NewestDeliveryID == 0 || runs[0].StartedAt.IsZero() ||
		runs[0].FinishedAt.Before(runs[0].StartedAt) {
		t.Fatalf("runs %+v, want one run record with 3 redeliveries in all", runs)
	}
	rds, err := ghsweep.ListRedeliveries(t.Context(), f.pool, "github", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(rds) != 2 || rds[0].GUID != "unknown" || rds[0].Requests != 2 || rds[0].Status != "requested" {
		t.Fatalf("redeliveries %+v, want unknown (2 requests) first, then lease-expired", rds)
	}
}

// TestPagination: 250 failed deliveries over pages of 100, followed through
// the Link header, are all redelivered, each once.
func TestPagination(t *testing.T) {
	t.Parallel()
	f := setup(t, fakegithub.Config{})
	for i := range 250 {
		f.failed(fmt.Sprintf("guid-%03d", i), time.Duration(250-i)*time.Second)
	}
	res := run(t, f.sweeper(t, nil))
	got := f.gh.Redeliveries()
	if len(got) != 250 || len(slices.Compact(sorted(got))) != 250 || res.Deliveries != 250 || res.New != 250 {
		t.Fatalf("redelivered %d (%d distinct), result deliveries=%d new=%d; want 250", len(got), len(slices.Compact(sorted(got))), res.Deliveries, res.New)
	}
	if got[0] != "guid-000" {
		t.Errorf("first redelivery %s, want the oldest failure first", got[0])
	}
	if n := f.gh.Requests(); n != 3+250 {
		t.Errorf("%d API requests, want 3 pages and 250 redeliveries", n)
	}
}

// TestWindow: deliveries older than the window are neither redelivered nor
// paged through.
func TestWindow(t *testing.T) {
	t.Parallel()
	f := setup(t, fakegithub.Config{})
	for i := range 50 {
		f.failed(fmt.Sprintf("old-%02d", i), 80*time.Hour+time.Duration(i)*time.Minute)
	}
	f.failed("two-days", 48*time.Hour)
	f.failed("fresh", time.Minute)
	res := run(t, f.sweeper(t, func(c *ghsweep.Config) { c.PerPage = 10 }))
	if got := sorted(f.gh.Redeliveries()); !slices.Equal(got, []string{"fresh", "two-days"}) {
		t.Fatalf("redelivered %q, want only the deliveries of the last 3 days", got)
	}
	if res.Deliveries != 2 {
		t.Errorf("deliveries = %d, want 2 within the window", res.Deliveries)
	}
	if n := f.gh.Requests(); n != 1+2 {
		t.Errorf("%d API requests, want 1 page (its oldest delivery is past the window) and 2 redeliveries", n)
	}
}

// TestRateLimit: a run waits for the reset GitHub announces when it is
// short enough, and stops with a RateLimitError, recorded, when it is not;
// a secondary limit's Retry-After is waited out.
func TestRateLimit(t *testing.T) {
	t.Parallel()
	f := setup(t, fakegithub.Config{})
	for i := range 6 {
		f.failed(fmt.Sprintf("guid-%d", i), time.Minute)
	}
	f.gh.SetRateLimit(4, time.Now().Add(1500*time.Millisecond))
	start := time.Now()
	res := run(t, f.sweeper(t, func(c *ghsweep.Config) { c.MaxRateLimitWait = 10 * time.Second }))
	if len(res.Redelivered) != 6 || len(f.gh.Redeliveries()) != 6 {
		t.Fatalf("redelivered %d, want 6 after waiting for the reset", len(res.Redelivered))
	}
	if time.Since(start) < 500*time.Millisecond {
		t.Errorf("run took %s: it did not wait for the rate limit's reset", time.Since(start))
	}

	// A reset an hour away is past MaxRateLimitWait.
	f.gh.SetRateLimit(1, time.Now().Add(time.Hour))
	f.failed("late", 0)
	_, err := f.sweeper(t, func(c *ghsweep.Config) { c.MaxRateLimitWait = 100 * time.Millisecond }).Run(t.Context())
	var rl *ghsweep.RateLimitError
	if !errors.Is(err, ghsweep.ErrRateLimited) || !errors.As(err, &rl) || time.Until(rl.Until) < 50*time.Minute {
		t.Fatalf("Run = %v, want a RateLimitError until about an hour from now", err)
	}
	runs, err := ghsweep.ListRuns(t.Context(), f.pool)
	if err != nil || len(runs) != 1 || !strings.Contains(runs[0].LastError, "rate limit") {
		t.Fatalf("runs %+v (%v), want the rate limit recorded as the last error", runs, err)
	}

	// A secondary limit: 429 with Retry-After: 1.
	f.gh.SetRateLimit(0, time.Time{})
	f.gh.SecondaryLimit(1, 1)
	start = time.Now()
	res = run(t, f.sweeper(t, nil))
	if len(res.Redelivered) != 1 || time.Since(start) < 900*time.Millisecond {
		t.Fatalf("after a secondary limit: redelivered %q in %s, want late after a 1s wait", res.Redelivered, time.Since(start))
	}
}

// TestTwoSweepersAtOnce: two sweepers of one hook started together (two
// instances of an application) request each guid once between them.
func TestTwoSweepersAtOnce(t *testing.T) {
	t.Parallel()
	f := setup(t, fakegithub.Config{})
	f.wrap = func(http.ResponseWriter, *http.Request) bool { time.Sleep(3 * time.Millisecond); return false }
	for i := range 100 {
		f.failed(fmt.Sprintf("guid-%03d", i), time.Minute)
	}
	a, b := f.sweeper(t, nil), f.sweeper(t, nil)
	var wg sync.WaitGroup
	results := make([]ghsweep.Result, 4)
	for i, s := range []*ghsweep.Sweeper{a, b, a, b} {
		wg.Go(func() { results[i] = run(t, s) })
	}
	wg.Wait()
	got := f.gh.Redeliveries()
	if len(got) != 100 || len(slices.Compact(sorted(got))) != 100 {
		t.Fatalf("%d redeliveries (%d distinct), want each of the 100 guids once", len(got), len(slices.Compact(sorted(got))))
	}
	busy := 0
	for _, r := range results {
		if r.Busy {
			busy++
		}
	}
	if busy == 0 {
		t.Errorf("no run found the other holding the lock: results %+v", results)
	}
}

// TestTokenNeverLogged: the token is sent to GitHub, but appears in no log
// record, no error and no database row, even when the API echoes it.
func TestTokenNeverLogged(t *testing.T) {
	t.Parallel()
	f := setup(t, fakegithub.Config{})
	f.failed("echoed", time.Minute)
	f.failed("ok", time.Minute)
	f.wrap = func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodPost && strings.Contains(r.URL.Path, fmt.Sprint(f.gh.Deliveries()[0].ID)) {
			w.WriteHeader(http.StatusBadGateway)
			fmt.Fprintf(w, `{"message":"upstream said %s"}`, r.Header.Get("Authorization"))
			return true
		}
		return false
	}
	res, err := f.sweeper(t, nil).Run(t.Context())
	if err == nil || res.Refused != 1 || len(res.Redelivered) != 1 {
		t.Fatalf("Run = %+v, %v; want one refused (502) and one redelivered", res, err)
	}
	// A wrong token: 401, which stops the run.
	_, err401 := f.sweeper(t, func(c *ghsweep.Config) { c.Token = testToken + "-wrong" }).Run(t.Context())
	var apiErr *ghsweep.APIError
	if !errors.As(err401, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized {
		t.Fatalf("Run with a wrong token = %v, want a 401 APIError", err401)
	}

	if !slices.Contains(f.gh.Authorizations(), "Bearer "+testToken) {
		t.Fatal("the token was never sent: the check below would prove nothing")
	}
	var dbText string
	if err := f.pool.QueryRow(t.Context(), `
		SELECT coalesce(string_agg(r::text, ' '), '') || (SELECT coalesce(string_agg(s::text, ' '), '') FROM txhook_sweeper_runs s)
		FROM txhook_redeliveries r`).Scan(&dbText); err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{"logs": f.logs.String(), "error": err.Error(), "401 error": err401.Error(), "database": dbText} {
		if strings.Contains(text, "s3cr3tT0ken") {
			t.Errorf("the token appears in the %s:\n%s", name, text)
		}
	}
	if !strings.Contains(err.Error(), "502") || !strings.Contains(err.Error(), "echoed") || !strings.Contains(dbText, "[REDACTED]") {
		t.Errorf("error %q and database %q: want the 502 of guid echoed, redacted", err, dbText)
	}
}

// TestRefusedRedeliveryAskedAgain: a redelivery GitHub refuses is recorded
// as failed, and the next run asks again.
func TestRefusedRedeliveryAskedAgain(t *testing.T) {
	t.Parallel()
	f := setup(t, fakegithub.Config{})
	d := f.failed("flaky", time.Minute)
	fail := true
	f.wrap = func(w http.ResponseWriter, r *http.Request) bool {
		if fail && r.Method == http.MethodPost {
			http.Error(w, `{"message":"Server Error"}`, http.StatusInternalServerError)
			return true
		}
		return false
	}
	s := f.sweeper(t, nil)
	if _, err := s.Run(t.Context()); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("/deliveries/%d/attempts: 500", d.ID)) {
		t.Fatalf("Run = %v, want the 500 of the redelivery named", err)
	}
	rds, err := ghsweep.ListRedeliveries(t.Context(), f.pool, "", 0)
	if err != nil || len(rds) != 1 || rds[0].Status != "failed" || !strings.Contains(rds[0].LastError, "500") {
		t.Fatalf("redeliveries %+v (%v), want flaky failed with the 500", rds, err)
	}
	f.mu.Lock()
	fail = false
	f.mu.Unlock()
	if res := run(t, s); !slices.Equal(res.Redelivered, []string{"flaky"}) {
		t.Fatalf("second run redelivered %q, want flaky", res.Redelivered)
	}
}

// TestOrgAndAppHooks: an organization hook with a token, and an App hook
// with a JSON Web Token signed by the App's key, which the fake verifies.
func TestOrgAndAppHooks(t *testing.T) {
	t.Parallel()
	org := setup(t, fakegithub.Config{Hook: "orgs/octo-org/hooks/9"})
	org.failed("org-guid", time.Minute)
	run(t, org.sweeper(t, func(c *ghsweep.Config) { c.Hook = ghsweep.OrgHook("octo-org", 9) }))
	if got := org.gh.Redeliveries(); !slices.Equal(got, []string{"org-guid"}) {
		t.Fatalf("organization hook: redelivered %q", got)
	}

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pemKey := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	app := setup(t, fakegithub.Config{Hook: "app/hook", AppID: "Iv1.abc123", AppKey: &key.PublicKey})
	app.failed("app-guid", time.Minute)
	run(t, app.sweeper(t, func(c *ghsweep.Config) {
		c.Hook, c.Token, c.AppID, c.AppPrivateKey = ghsweep.AppHook(), "", "Iv1.abc123", pemKey
	}))
	if got := app.gh.Redeliveries(); !slices.Equal(got, []string{"app-guid"}) {
		t.Fatalf("App hook: redelivered %q", got)
	}
	// Another App's key is refused by GitHub.
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	otherPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(other)})
	_, err = app.sweeper(t, func(c *ghsweep.Config) {
		c.Hook, c.Token, c.AppID, c.AppPrivateKey = ghsweep.AppHook(), "", "Iv1.abc123", otherPEM
	}).Run(t.Context())
	var apiErr *ghsweep.APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized {
		t.Fatalf("Run with another App's key = %v, want 401", err)
	}
}

// TestConfigErrors: a sweeper needs a hook and its credential.
func TestConfigErrors(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t).Pool
	for _, c := range []ghsweep.Config{
		{},
		{Hook: ghsweep.RepoHook("o", "r", 1)},
		{Hook: ghsweep.RepoHook("o", "", 1), Token: "t"},
		{Hook: ghsweep.OrgHook("o", 0), Token: "t"},
		{Hook: ghsweep.AppHook(), AppID: "1"},
		{Hook: ghsweep.AppHook(), AppID: "1", AppPrivateKey: []byte("not a key")},
		{Hook: ghsweep.RepoHook("o", "r", 1), Token: "t", APIURL: "ftp://example.com"},
	} {
		if _, err := ghsweep.New(pool, &c); err == nil {
			t.Errorf("New(%+v) succeeded, want an error", c)
		}
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestNextLinkOnAnotherHost: a Link header pointing away from the API is
// not followed, so the token goes nowhere else.
func TestNextLinkOnAnotherHost(t *testing.T) {
	t.Parallel()
	f := setup(t, fakegithub.Config{})
	f.failed("guid", time.Minute)
	f.wrap = func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Link", `<https://evil.example/repos/octo-org/octo-repo/hooks/7/deliveries?cursor=v1_1>; rel="next"`)
		return false
	}
	_, err := f.sweeper(t, nil).Run(t.Context())
	if err == nil || !strings.Contains(err.Error(), "next page link points to https://evil.example") {
		t.Fatalf("Run = %v, want an error naming the foreign host", err)
	}
	if n := len(f.gh.Redeliveries()); n != 0 {
		t.Fatalf("%d redeliveries after a bad listing, want none", n)
	}
}

// TestSweeperDiedMidRequest: a redelivery left "requesting" by a sweeper
// that died while sending it holds its guid back for a minute only (GitHub
// attempts an accepted redelivery within seconds), not for ResendAfter.
func TestSweeperDiedMidRequest(t *testing.T) {
	t.Parallel()
	f := setup(t, fakegithub.Config{})
	d := f.failed("orphan", time.Hour)
	f.failed("fresh-orphan", time.Hour)
	_, err := f.pool.Exec(t.Context(), `
		INSERT INTO txhook_redeliveries (source, guid, hook, last_delivery_id, status, first_failed_at, requested_at)
		VALUES ('github', 'orphan', 'repos/octo-org/octo-repo/hooks/7', $1, 'requesting', now() - interval '1 hour', now() - interval '2 minutes'),
		       ('github', 'fresh-orphan', 'repos/octo-org/octo-repo/hooks/7', $1 + 1, 'requesting', now() - interval '1 hour', now() - interval '10 seconds')`, d.ID)
	if err != nil {
		t.Fatal(err)
	}
	res := run(t, f.sweeper(t, nil))
	if !slices.Equal(res.Redelivered, []string{"orphan"}) || res.Waiting != 1 {
		t.Fatalf("result %+v, want orphan redelivered and fresh-orphan waiting", res)
	}
	var status string
	if err := f.pool.QueryRow(t.Context(), `SELECT status FROM txhook_redeliveries WHERE guid = 'orphan'`).Scan(&status); err != nil || status != "requested" {
		t.Fatalf("orphan's status = %q (%v), want requested once GitHub accepted", status, err)
	}
}

// TestBackoff: a guid whose redeliveries keep failing is asked for again
// only after Backoff, doubled with every request.
func TestBackoff(t *testing.T) {
	t.Parallel()
	f := setup(t, fakegithub.Config{})
	f.failed("poison", 2*time.Hour)
	s := f.sweeper(t, func(c *ghsweep.Config) { c.Backoff = time.Hour; c.ResendAfter = 24 * time.Hour })
	age := func(d time.Duration) {
		t.Helper()
		if _, err := f.pool.Exec(t.Context(), `UPDATE txhook_redeliveries SET requested_at = now() - $1::interval WHERE guid = 'poison'`,
			fmt.Sprintf("%d seconds", int(d.Seconds()))); err != nil {
			t.Fatal(err)
		}
	}
	run(t, s) // request 1
	f.failed("poison", 0)
	if res := run(t, s); len(res.Redelivered) != 0 || res.Waiting != 1 {
		t.Fatalf("right after a failed redelivery: %+v, want poison waiting out its backoff", res)
	}
	age(61 * time.Minute)
	if res := run(t, s); len(res.Redelivered) != 1 {
		t.Fatalf("after 1h: %+v, want poison asked for a second time", res)
	}
	f.failed("poison", 0)
	age(61 * time.Minute)
	if res := run(t, s); len(res.Redelivered) != 0 {
		t.Fatalf("1h after the second request: %+v, want a 2h backoff", res)
	}
	age(121 * time.Minute)
	if res := run(t, s); len(res.Redelivered) != 1 {
		t.Fatalf("2h after the second request: %+v, want a third request", res)
	}
	if n := len(f.gh.Redeliveries()); n != 3 {
		t.Fatalf("%d requests, want 3", n)
	}
}

// TestBackoffOutlastsResendAfter: once the backoff is longer than
// ResendAfter, ResendAfter alone does not make a guid eligible.
func TestBackoffOutlastsResendAfter(t *testing.T) {
	t.Parallel()
	f := setup(t, fakegithub.Config{})
	f.failed("poison", 2*time.Hour)
	run(t, f.sweeper(t, nil))
	if _, err := f.pool.Exec(t.Context(), `UPDATE txhook_redeliveries SET requests = 5, requested_at = now() - interval '20 minutes'`); err != nil {
		t.Fatal(err)
	}
	// 20 minutes after a 5th request: its backoff, 1m * 2^4 = 16m, has passed.
	s := f.sweeper(t, func(c *ghsweep.Config) { c.Backoff = time.Minute; c.ResendAfter = 15 * time.Minute })
	if res := run(t, s); len(res.Redelivered) != 1 {
		t.Fatalf("20m after a 5th request (16m backoff): %+v, want poison asked again", res)
	}
	if _, err := f.pool.Exec(t.Context(), `UPDATE txhook_redeliveries SET requested_at = now() - interval '20 minutes'`); err != nil {
		t.Fatal(err)
	}
	// 20 minutes after a 6th: its backoff is 32m, longer than ResendAfter (15m).
	if res := run(t, s); len(res.Redelivered) != 0 || res.Waiting != 1 {
		t.Fatalf("20m after a 6th request (32m backoff, 15m ResendAfter): %+v, want poison waiting", res)
	}
}
