package ghsweep_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txhook/txhook/ghsweep"
	"github.com/txhook/txhook/internal/fakegithub"
)

// Tests of answers a GitHub API (or whatever answers at its URL) should
// never give: redirects away from it, listings that never end, deliveries
// that cannot be keys, error bodies that echo the token.

// TestRedirectsStayOnTheAPIOrigin: a redirect within the API's origin (as
// GitHub answers for a renamed repository) is followed, with the token; a
// redirect to the same host on another port, or from https to http, is
// refused before anything is sent there, with the sweeper's own HTTP client
// and with the caller's.
func TestRedirectsStayOnTheAPIOrigin(t *testing.T) {
	t.Parallel()
	var reached atomic.Int32 // requests that reached the other origin
	var leaked atomic.Bool   // one of them carried the token
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		leaked.Store(leaked.Load() || strings.Contains(r.Header.Get("Authorization"), testToken))
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, "[]")
	}))
	t.Cleanup(other.Close)
	f := setup(t, fakegithub.Config{})
	f.failed("guid", time.Minute)

	f.gh.Redirect(1, http.StatusMovedPermanently, f.api.URL)
	if res := run(t, f.sweeper(t, nil)); !slices.Equal(res.Redelivered, []string{"guid"}) {
		t.Fatalf("after a redirect within the origin: %+v, want guid redelivered", res)
	}

	tlsAPI := httptest.NewTLSServer(f.gh)
	t.Cleanup(tlsAPI.Close)
	for _, c := range []struct {
		name string
		edit func(*ghsweep.Config)
	}{
		{"another port", nil},
		{"https to http, the caller's client", func(c *ghsweep.Config) { c.APIURL, c.HTTPClient = tlsAPI.URL, tlsAPI.Client() }},
	} {
		f.gh.Redirect(1, http.StatusTemporaryRedirect, other.URL)
		_, err := f.sweeper(t, c.edit).Run(t.Context())
		if err == nil || !strings.Contains(err.Error(), "redirect to "+other.URL+" refused") {
			t.Errorf("%s: Run = %v, want the redirect to %s refused", c.name, err, other.URL)
		}
	}
	if n := reached.Load(); n != 0 || leaked.Load() {
		t.Fatalf("%d requests reached the other origin (token among them: %v), want none", n, leaked.Load())
	}
	if tlsAPI.Client().CheckRedirect != nil {
		t.Error("the caller's client was changed")
	}
}

// TestListingBounded: a run is bounded however the listing goes on: a next
// page link that repeats a page, endless distinct pages (a page cap derived
// from the window), a slow listing (half the run's deadline) and slow
// redeliveries (the deadline). A run cut short redelivers what it listed,
// says why in its Result and its error, is recorded as such, and leaves the
// hook's lock free.
func TestListingBounded(t *testing.T) {
	t.Parallel()
	// endless makes every listed page link to one more page.
	endless := func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodGet {
			n, _ := strconv.Atoi(r.URL.Query().Get("page"))
			w.Header().Set("Link", fmt.Sprintf(`<%s?per_page=100&page=%d>; rel="next"`, r.URL.Path, n+1))
		}
		return false
	}
	for _, c := range []struct {
		name        string
		wrap        func(w http.ResponseWriter, r *http.Request) bool
		edit        func(*ghsweep.Config)
		guids       int
		gets        int // -1: not counted
		redelivered int // -1: some, not all
		why         string
	}{
		{
			name: "page repeated",
			wrap: func(w http.ResponseWriter, r *http.Request) bool {
				w.Header().Set("Link", fmt.Sprintf(`<%s>; rel="next"`, r.URL.RequestURI()))
				return false
			},
			guids: 2, gets: 1, redelivered: 2, why: "repeats a page",
		},
		{
			name:  "endless pages, the default cap of a 1h window",
			wrap:  endless,
			edit:  func(c *ghsweep.Config) { c.Window = time.Hour },
			guids: 2, gets: 12, redelivered: 2, why: "MaxPages (12 pages)",
		},
		{
			name: "slow endless pages",
			wrap: func(w http.ResponseWriter, r *http.Request) bool {
				if r.Method == http.MethodGet {
					time.Sleep(100 * time.Millisecond)
				}
				return endless(w, r)
			},
			edit:  func(c *ghsweep.Config) { c.MaxPages, c.RunTimeout = 1_000_000, 2*time.Second },
			guids: 2, gets: -1, redelivered: 2, why: "half of RunTimeout (1s)",
		},
		{
			name: "slow redeliveries",
			wrap: func(w http.ResponseWriter, r *http.Request) bool {
				if r.Method == http.MethodPost {
					time.Sleep(400 * time.Millisecond)
				}
				return false
			},
			edit:  func(c *ghsweep.Config) { c.RunTimeout = 2 * time.Second },
			guids: 20, gets: 1, redelivered: -1, why: "the run reached RunTimeout (2s)",
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, fakegithub.Config{})
			f.wrap = c.wrap
			for i := range c.guids {
				f.failed(fmt.Sprintf("guid-%02d", i), time.Duration(c.guids-i)*time.Second)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			s := f.sweeper(t, c.edit)
			res, err := s.Run(ctx)
			if ctx.Err() != nil {
				t.Fatalf("the run outlasted the test's 5s: %+v, %v", res, err)
			}
			if err == nil || !strings.Contains(err.Error(), "run cut short") || !strings.Contains(res.CutShort, c.why) {
				t.Fatalf("Run = %+v, %v; want it cut short: %s", res, err, c.why)
			}
			if gets := f.gh.Requests() - len(f.gh.Redeliveries()); c.gets >= 0 && gets != c.gets {
				t.Errorf("%d pages read, want %d", gets, c.gets)
			}
			n := len(res.Redelivered)
			if (c.redelivered >= 0 && n != c.redelivered) || (c.redelivered < 0 && (n == 0 || n == c.guids)) {
				t.Errorf("redelivered %d of %d listed guids, want %d (-1: some, not all)", n, c.guids, c.redelivered)
			}
			if res.Deliveries != c.guids {
				t.Errorf("deliveries = %d, want %d: a delivery listed twice is counted once", res.Deliveries, c.guids)
			}
			runs, err := ghsweep.ListRuns(t.Context(), f.pool)
			if err != nil || len(runs) != 1 || runs[0].CutShort != res.CutShort || !strings.Contains(runs[0].LastError, "run cut short") {
				t.Fatalf("runs %+v (%v), want the run recorded as cut short: %s", runs, err, res.CutShort)
			}
			f.mu.Lock()
			f.wrap = nil // a request the deadline cut may still be served
			f.mu.Unlock()
			// The next run redelivers the rest, but for a request the
			// deadline cut: its outcome is unknown, so it waits.
			again := run(t, f.sweeper(t, nil))
			if again.Busy || again.CutShort != "" || len(again.Redelivered)+again.Waiting != c.guids || len(again.Redelivered) < c.guids-n-1 {
				t.Fatalf("next run: %+v, want the lock free and the other %d guids redelivered (but one whose request was cut)", again, c.guids-n)
			}
		})
	}
}

// TestRunEveryRecordsABoundedRun: under RunEvery, a listing whose next page
// is itself ends the first run, which is recorded.
func TestRunEveryRecordsABoundedRun(t *testing.T) {
	t.Parallel()
	f := setup(t, fakegithub.Config{})
	f.failed("guid", time.Minute)
	f.wrap = func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Link", fmt.Sprintf(`<%s>; rel="next"`, r.URL.RequestURI()))
		return false
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); f.sweeper(t, nil).RunEvery(ctx, time.Hour) }()
	defer func() { cancel(); <-done }()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		runs, err := ghsweep.ListRuns(t.Context(), f.pool)
		if err != nil {
			t.Fatal(err)
		}
		if len(runs) == 1 && runs[0].CutShort != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no run recorded within 5s (%d requests made), want the first run cut short and recorded", f.gh.Requests())
		}
	}
}

// TestBadListedDeliveriesSkipped: a listed delivery whose guid or event
// cannot be an event's key or type (a NUL byte, longer than a key, empty)
// is skipped and logged; the good guids of the same listing are
// redelivered.
func TestBadListedDeliveriesSkipped(t *testing.T) {
	t.Parallel()
	f := setup(t, fakegithub.Config{})
	f.failed("good-1", time.Hour)
	for _, d := range []fakegithub.Delivery{
		{GUID: "nul\x00guid", Event: "push"},
		{GUID: "nul-event", Event: "pu\x00sh"},
		{GUID: strings.Repeat("g", 300), Event: "push"},
		{GUID: "", Event: "push"},
	} {
		d.StatusCode, d.DeliveredAt = 502, time.Now().Add(-30*time.Minute)
		f.gh.Add(d)
	}
	f.failed("good-2", time.Minute)
	s := f.sweeper(t, nil)
	res := run(t, s)
	if got := sorted(res.Redelivered); !slices.Equal(got, []string{"good-1", "good-2"}) || res.Skipped != 4 || res.Failed != 2 {
		t.Fatalf("result %+v, want good-1 and good-2 redelivered, 4 skipped", res)
	}
	if got := sorted(f.gh.Redeliveries()); !slices.Equal(got, []string{"good-1", "good-2"}) {
		t.Fatalf("redelivered %q", got)
	}
	logs := f.logs.String()
	if strings.Count(logs, "listed delivery skipped") != 4 || !strings.Contains(logs, `nul\u0000guid`) || !strings.Contains(logs, "NUL byte") {
		t.Errorf("logs:\n%s\nwant each skipped delivery logged, with its guid and why", logs)
	}
	if res := run(t, s); res.Skipped != 4 || res.Waiting != 2 {
		t.Fatalf("second run: %+v, want the same 4 skipped and 2 waiting", res)
	}
}

// TestErrorBodyRedactedBeforeTheCut: an error body that is not GitHub's
// JSON is cut to its start; a token straddling the cut is redacted first,
// so none of it is in the error, the log or the database. A body cut in a
// multi-byte character, or a message with a NUL byte, is still recorded
// with the refusal.
func TestErrorBodyRedactedBeforeTheCut(t *testing.T) {
	t.Parallel()
	f := setup(t, fakegithub.Config{})
	bodies := map[int64]string{
		f.failed("straddling", 3*time.Minute).ID: strings.Repeat("x", 180) + "Bearer " + testToken + " was refused upstream",
		f.failed("cut-rune", 2*time.Minute).ID:   strings.Repeat("x", 199) + "ééé",
		f.failed("nul", time.Minute).ID:          `{"message":"upstream\u0000said no"}`,
	}
	f.wrap = func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodPost {
			return false
		}
		for id, body := range bodies {
			if strings.Contains(r.URL.Path, fmt.Sprintf("/deliveries/%d/", id)) {
				w.WriteHeader(http.StatusBadGateway)
				fmt.Fprint(w, body)
				return true
			}
		}
		return false
	}
	res, err := f.sweeper(t, nil).Run(t.Context())
	if err == nil || res.Refused != 3 {
		t.Fatalf("Run = %+v, %v; want 3 refused", res, err)
	}
	rds, lerr := ghsweep.ListRedeliveries(t.Context(), f.pool, "github", 10)
	if lerr != nil || len(rds) != 3 {
		t.Fatalf("redeliveries %+v (%v), want the 3 refusals recorded", rds, lerr)
	}
	var dbText strings.Builder
	for _, r := range rds {
		if r.Status != "failed" || !strings.Contains(r.LastError, "502") {
			t.Errorf("redelivery %+v, want failed with the 502", r)
		}
		dbText.WriteString(r.LastError)
	}
	if !strings.Contains(dbText.String(), "[REDACTED]") {
		t.Errorf("database %q: want the token redacted", dbText.String())
	}
	for name, text := range map[string]string{"error": err.Error(), "logs": f.logs.String(), "database": dbText.String()} {
		if strings.Contains(text, testToken[:8]) {
			t.Errorf("the start of the token appears in the %s:\n%s", name, text)
		}
	}
}
