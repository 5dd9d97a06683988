// Package console tests txhook's operator console (package admin) in a real
// headless Chromium against a real PostgreSQL: the pages render seeded
// events, the filters work, Replay applies a dead letter exactly once,
// Discard deletes one, a write without the CSRF token is refused, and a
// read-only console shows no write buttons and refuses writes.
//
// With TXHOOK_SCREENSHOTS set to a folder, TestPages writes a screenshot of
// every page there (make screenshots writes them into docs/).
package console

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/admin"
	"github.com/txhook/txhook/internal/testdb"
)

func TestMain(m *testing.M) {
	defer stopChromium()
	testdb.Main(m)
}

// console is one test's console: a database with seeded events, a ledger
// table that the replay handler writes to, and the console served at
// URL + "/txhook/".
type console struct {
	pool *pgxpool.Pool
	url  string
	logs *logBuffer
}

// setup seeds a database and serves a console configured by cfg (its
// Processor, with the replay's route, and Logger are filled in).
func setup(t *testing.T, cfg admin.Config) *console {
	t.Helper()
	d := testdb.New(t)
	ctx := t.Context()
	if _, err := d.Pool.Exec(ctx, `CREATE TABLE ledger (event_key text NOT NULL, amount bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	seed(t, d.Pool)
	// A prune run with the default retention: nothing is that old.
	if _, err := txhook.Prune(ctx, d.Pool, txhook.PruneOptions{}); err != nil {
		t.Fatal(err)
	}
	routes := txhook.NewRoutes()
	routes.Transactional("stripe", "invoice.paid", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		var p struct {
			Amount int64 `json:"amount"`
		}
		if err := json.Unmarshal(ev.Payload, &p); err != nil {
			return txhook.Permanent(err)
		}
		if p.Amount < 0 {
			return txhook.Permanent(fmt.Errorf("negative amount %d", p.Amount))
		}
		// Not idempotent on its own: only the replay's exactly-once rule
		// keeps the ledger right.
		_, err := tx.Exec(ctx, "INSERT INTO ledger (event_key, amount) VALUES ($1, $2)", ev.Key, p.Amount)
		return err
	})
	proc, err := txhook.NewProcessor(d.Pool, &txhook.Config{Routes: routes})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Processor = proc
	logs := &logBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	cfg.User = func(r *http.Request) string { return r.Header.Get("X-Test-User") }
	mux := http.NewServeMux()
	mux.Handle("/txhook/", http.StripPrefix("/txhook", newConsole(t, d.Pool, &cfg)))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &console{pool: d.Pool, url: srv.URL, logs: logs}
}

// seed writes a day of events: done events of three sources spread over the
// last three hours (for the chart), four dead letters and one event in
// flight under a lease.
func seed(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(t.Context(), `
		INSERT INTO txhook_processed_events (source, event_key, event_type, status, created_at, claimed_at, completed_at, payload)
		SELECT s.source, 'evt_' || s.source || '_' || lpad(g::text, 4, '0'),
		       CASE WHEN g % 3 = 0 THEN 'invoice.created' ELSE 'invoice.paid' END,
		       'done', t.at, t.at, t.at + interval '40 milliseconds',
		       CASE WHEN s.source = 'stripe' THEN convert_to('{"id":"evt_' || g || '","amount":' || g || '}', 'UTF8') END
		FROM (VALUES ('stripe', 400), ('github', 150), ('shopify', 60)) AS s(source, n),
		     generate_series(1, s.n) AS g,
		     LATERAL (SELECT now() - (g * 167 % 175) * interval '1 minute' - (g % 7) * interval '3 seconds' AS at) AS t;

		INSERT INTO txhook_processed_events (source, event_key, event_type, status, attempts, created_at, claimed_at, completed_at, last_error, payload)
		VALUES
		  ('stripe', 'evt_dead_1', 'invoice.paid', 'failed', 1, now() - interval '50 minutes', now() - interval '50 minutes', now() - interval '50 minutes',
		   'permanent: customer cus_123 not found', convert_to('{"id":"evt_dead_1","type":"invoice.paid","amount":4200,"customer":"cus_123"}', 'UTF8')),
		  ('stripe', 'evt_dead_2', 'invoice.paid', 'failed', 2, now() - interval '40 minutes', now() - interval '40 minutes', now() - interval '30 minutes',
		   'permanent: customer cus_456 not found', convert_to('{"id":"evt_dead_2","type":"invoice.paid","amount":1500,"customer":"cus_456"}', 'UTF8')),
		  ('stripe', 'evt_dead_neg', 'invoice.paid', 'failed', 1, now() - interval '20 minutes', now() - interval '20 minutes', now() - interval '20 minutes',
		   'permanent: negative amount -5', convert_to('{"id":"evt_dead_neg","amount":-5}', 'UTF8')),
		  ('github', 'a1b2c3d4-0000-4000-8000-000000000001', 'push', 'failed', 1, now() - interval '10 minutes', now() - interval '10 minutes', now() - interval '10 minutes',
		   'permanent: repository not tracked', NULL);

		INSERT INTO txhook_processed_events (source, event_key, event_type, status, attempts, created_at, claimed_at, lease_expires_at)
		VALUES ('stripe', 'evt_busy_1', 'payment_intent.succeeded', 'in_progress', 2, now() - interval '2 minutes', now() - interval '15 seconds', now() + interval '45 seconds');

		ANALYZE txhook_processed_events;
	`)
	if err != nil {
		t.Fatalf("seed: %v", err)
	}
}

type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (c *console) status(t *testing.T, source, key string) string {
	t.Helper()
	var s string
	err := c.pool.QueryRow(t.Context(), "SELECT status FROM txhook_processed_events WHERE source = $1 AND event_key = $2", source, key).Scan(&s)
	if err == pgx.ErrNoRows {
		return "absent"
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (c *console) ledger(t *testing.T, key string) int {
	t.Helper()
	var n int
	if err := c.pool.QueryRow(t.Context(), "SELECT count(*) FROM ledger WHERE event_key = $1", key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// text returns the text of the elements matching sel, joined by newlines.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	nodes, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
		fmt.Sprintf(`Array.from(document.querySelectorAll(%q)).map(e => e.innerText)`, sel)))
	if err != nil {
		t.Fatalf("read %s: %v", sel, err)
	}
	return strings.Join(nodes, "\n")
}

// count returns how many elements match sel.
func count(t *testing.T, ctx context.Context, sel string) int {
	t.Helper()
	n, err := chromedp.Run(ctx, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%q).length`, sel)))
	if err != nil {
		t.Fatalf("count %s: %v", sel, err)
	}
	return n
}

// clickAndLoad clicks the element that sel selects and waits until the page
// it leads to has loaded.
func clickAndLoad(t *testing.T, ctx context.Context, sel string) {
	t.Helper()
	before, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}
	run(t, ctx, chromedp.Click(chromedp.CSS(sel)),
		waitFor(fmt.Sprintf(`location.href !== %q && document.readyState === "complete"`, before)))
}

// waitFor waits until the JavaScript expression is true, across the
// navigation that a click starts.
func waitFor(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		for {
			if ok, err := chromedp.Evaluate[bool](expr)(ctx, t); err == nil && ok {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("wait for %s: %w", expr, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
}

func run(t *testing.T, ctx context.Context, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatal(err)
	}
}

// screenshot writes the visible part of the page to $TXHOOK_SCREENSHOTS/name.png when the
// variable is set.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("TXHOOK_SCREENSHOTS")
	if dir == "" {
		return
	}
	// The viewport: a long list is cut at the window's height.
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", path)
}

func TestPages(t *testing.T) {
	c := setup(t, admin.Config{AllowWrites: true})
	ctx := newTab(t)

	// Inbox mode's queue: no card while nothing is queued; then two events
	// accepted and waiting for their jobs, the oldest 3 minutes ago.
	run(t, ctx, chromedp.Navigate(c.url+"/txhook/"), chromedp.WaitVisible(chromedp.CSS("#sources")))
	if n := count(t, ctx, "#inbox-queue"); n != 0 {
		t.Errorf("overview: an inbox queue card with nothing queued")
	}
	if _, err := c.pool.Exec(t.Context(), `
		INSERT INTO txhook_processed_events (source, event_key, event_type, status, created_at, payload)
		VALUES ('github', 'q-1', 'push', 'queued', now() - interval '3 minutes', '{}'),
		       ('github', 'q-2', 'push', 'queued', now() - interval '20 seconds', '{}')`); err != nil {
		t.Fatal(err)
	}
	run(t, ctx, chromedp.Navigate(c.url+"/txhook/"), chromedp.WaitVisible(chromedp.CSS("#sources")))
	if got := text(t, ctx, "#inbox-queue"); !regexp.MustCompile(`^2\s+queued \(inbox\), oldest accepted 3m0s ago$`).MatchString(got) {
		t.Errorf("overview: inbox queue = %q, want 2 queued, the oldest 3 minutes ago", got)
	}
	if got := text(t, ctx, "#dead-letters"); got != "4" {
		t.Errorf("overview: dead letters = %q, want 4", got)
	}
	if got := text(t, ctx, "#in-flight"); got != "1" {
		t.Errorf("overview: in flight = %q, want 1", got)
	}
	if got := text(t, ctx, "#settled-24h"); got != "614" {
		t.Errorf("overview: settled in 24 h = %q, want 614 (610 done, 4 failed)", got)
	}
	sources := text(t, ctx, "#sources tbody")
	for _, want := range []string{"github\t150\t1\t1\t0", "shopify\t60\t0\t0\t0", "stripe\t400\t3\t3\t1"} {
		if !strings.Contains(sources, want) {
			t.Errorf("overview: sources table lacks the row %q:\n%s", want, sources)
		}
	}
	if n := count(t, ctx, "#chart rect"); n < 100 {
		t.Errorf("overview: chart has %d bars, want one per minute with events (over 100)", n)
	}
	if got := text(t, ctx, "#oldest"); !strings.Contains(got, "stripe / evt_busy_1") || !strings.Contains(got, "attempt 2") || !strings.Contains(got, "lease ends in") {
		t.Errorf("overview: oldest in flight = %q", got)
	}
	if got := text(t, ctx, "#prune"); !regexp.MustCompile(`^Last run started \d+(\.\d+)?m?s ago, last batch \d+(\.\d+)?m?s ago: deleted 0 done events completed before \S+ \S+, in 1 batch\.$`).MatchString(got) {
		t.Errorf("overview: prune = %q", got)
	}
	screenshot(t, ctx, "console-overview")

	run(t, ctx, chromedp.Navigate(c.url+"/txhook/events"), chromedp.WaitVisible(chromedp.CSS("#events")))
	if n := count(t, ctx, "#events tbody tr"); n != 50 {
		t.Errorf("events: %d rows on the first page, want 50", n)
	}
	if n := count(t, ctx, "#next"); n != 1 {
		t.Errorf("events: no next page link")
	}
	screenshot(t, ctx, "console-events")

	run(t, ctx, chromedp.Navigate(c.url+"/txhook/dead-letters"), chromedp.WaitVisible(chromedp.CSS("#events")))
	rows := text(t, ctx, "#events tbody")
	for _, want := range []string{"evt_dead_1", "evt_dead_2", "evt_dead_neg", "a1b2c3d4-0000-4000-8000-000000000001", "customer cus_123 not found", "payload not stored"} {
		if !strings.Contains(rows, want) {
			t.Errorf("dead letters lack %q:\n%s", want, rows)
		}
	}
	if n := count(t, ctx, "button.replay-one"); n != 3 {
		t.Errorf("dead letters: %d Replay buttons, want 3 (not for the event without a payload)", n)
	}
	screenshot(t, ctx, "console-dead-letters")

	run(t, ctx, chromedp.Click(chromedp.CSS(`a[href*="evt_dead_1"]`)), chromedp.WaitVisible(chromedp.CSS("#payload")))
	if got := text(t, ctx, "#status"); got != "failed" {
		t.Errorf("event: status %q", got)
	}
	payload := text(t, ctx, "#payload")
	if !strings.Contains(payload, "{\n  \"id\": \"evt_dead_1\",\n  \"type\": \"invoice.paid\",") {
		t.Errorf("event: payload not pretty-printed:\n%s", payload)
	}
	if got := text(t, ctx, "#last-error"); got != "permanent: customer cus_123 not found" {
		t.Errorf("event: last error %q", got)
	}
	if got := text(t, ctx, "#payload-note"); got != "76 bytes, JSON Download" || count(t, ctx, `a#download[href="payload?key=evt_dead_1&source=stripe"][download]`) != 1 {
		t.Errorf("event: payload note %q, or no download link", got)
	}
	screenshot(t, ctx, "console-event")

	// Lease mode: the lease and the fencing token.
	run(t, ctx, chromedp.Navigate(c.url+"/txhook/event?source=stripe&key=evt_busy_1"), chromedp.WaitVisible(chromedp.CSS("#fields")))
	fields := text(t, ctx, "#fields")
	if !strings.Contains(fields, "2 (fencing token of the current claim)") || !regexp.MustCompile(`lease expires\s+\S+ \S+ \(ends in \d+s\)`).MatchString(fields) {
		t.Errorf("event in flight: fields lack the lease and fencing token:\n%s", fields)
	}
}

func TestFilters(t *testing.T) {
	c := setup(t, admin.Config{PageSize: 40})
	ctx := newTab(t)

	// Through the form, as an operator would: source and status.
	run(t, ctx, chromedp.Navigate(c.url+"/txhook/events"), chromedp.WaitVisible(chromedp.CSS("#events")),
		chromedp.SetValue(chromedp.CSS(`select[name="source"]`), "github"),
		chromedp.SetValue(chromedp.CSS(`select[name="status"]`), "failed"),
	)
	clickAndLoad(t, ctx, ".filters button")
	loc, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(loc, "source=github") || !strings.Contains(loc, "status=failed") {
		t.Errorf("filter form went to %s", loc)
	}
	if got := text(t, ctx, "#events tbody td.key"); got != "a1b2c3d4-0000-4000-8000-000000000001" {
		t.Errorf("github failed events = %q, want the one github dead letter", got)
	}

	// Type and time: shopify's invoice.created events (every third), settled in the last hour.
	var want int
	if err := c.pool.QueryRow(t.Context(), `SELECT count(*) FROM txhook_processed_events
		WHERE source = 'shopify' AND event_type = 'invoice.created' AND completed_at >= now() - interval '1 hour'`).Scan(&want); err != nil {
		t.Fatal(err)
	}
	run(t, ctx, chromedp.Navigate(c.url+"/txhook/events?source=shopify&type=invoice.created&since=1h"), chromedp.WaitReady(chromedp.CSS("body")))
	if n := count(t, ctx, "#events tbody tr"); n != want || want == 0 {
		t.Errorf("shopify invoice.created in the last hour: %d rows, want %d", n, want)
	}
	if got := text(t, ctx, "#events tbody"); strings.Contains(got, "invoice.paid") || strings.Contains(got, "stripe") {
		t.Errorf("type filter let other rows through:\n%s", got)
	}

	// Keyset pages: every github event once, across pages of 40, in order.
	run(t, ctx, chromedp.Navigate(c.url+"/txhook/events?source=github&status=done"), chromedp.WaitVisible(chromedp.CSS("#events")))
	seen := map[string]bool{}
	for page := 1; ; page++ {
		keys := strings.Fields(text(t, ctx, "#events tbody td.key"))
		for _, k := range keys {
			if seen[k] {
				t.Fatalf("page %d repeats %s", page, k)
			}
			seen[k] = true
		}
		if count(t, ctx, "#next") == 0 {
			break
		}
		if page > 10 {
			t.Fatal("more pages than events")
		}
		clickAndLoad(t, ctx, "#next")
	}
	if len(seen) != 150 {
		t.Errorf("pages showed %d github events, want 150", len(seen))
	}

	// A bad filter is an error page, not a 500.
	run(t, ctx, chromedp.Navigate(c.url+"/txhook/events?since=last+tuesday"), chromedp.WaitVisible(chromedp.CSS("#error")))
	if got := text(t, ctx, "#error"); !strings.Contains(got, "since:") {
		t.Errorf("bad since: %q", got)
	}
}

func TestReplayAppliesOnce(t *testing.T) {
	c := setup(t, admin.Config{AllowWrites: true})
	ctx := newTab(t)

	// One row's own Replay button.
	run(t, ctx, chromedp.Navigate(c.url+"/txhook/dead-letters"), chromedp.WaitVisible(chromedp.CSS("#events")),
		chromedp.Click(chromedp.CSS(`button.replay-one[data-key="evt_dead_1"]`)), chromedp.WaitVisible(chromedp.CSS("#summary")))
	if got := text(t, ctx, "#summary"); got != "Replay: 1 of 1 done." {
		t.Errorf("replay summary = %q", got)
	}
	if n, s := c.ledger(t, "evt_dead_1"), c.status(t, "stripe", "evt_dead_1"); n != 1 || s != "done" {
		t.Errorf("after replay: ledger rows %d, status %s; want 1 and done", n, s)
	}
	// The same POST again (a double submit, or a form left open in another
	// tab): nothing runs twice.
	cl, token := formToken(t, c.url+"/txhook/dead-letters")
	id := "c3RyaXBl.ZXZ0X2RlYWRfMQ" // stripe / evt_dead_1
	if code, body := post(t, cl, c.url+"/txhook/replay", url.Values{"one": {id}, "csrf": {token}}); code != http.StatusOK || !strings.Contains(body, "already done: nothing ran") {
		t.Errorf("second replay: %d\n%s", code, body)
	}
	if n := c.ledger(t, "evt_dead_1"); n != 1 {
		t.Errorf("after a second replay: ledger rows %d, want 1", n)
	}

	// The selected ones: evt_dead_2 replays, evt_dead_neg fails again, the
	// github one has no payload.
	run(t, ctx, chromedp.Navigate(c.url+"/txhook/dead-letters"), chromedp.WaitVisible(chromedp.CSS("#events")))
	if n := count(t, ctx, `button.replay-one[data-key="evt_dead_1"]`); n != 0 {
		t.Errorf("a replayed event is still listed as a dead letter")
	}
	run(t, ctx, chromedp.Click(chromedp.CSS(`input[name="ev"]`), chromedp.NodeVisible)) // a click on the first box
	ids, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('input[name="ev"]')).map(e => { e.checked = true; return e.value })`))
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 3 {
		t.Fatalf("%d dead letters to select, want 3", len(ids))
	}
	run(t, ctx, chromedp.Click(chromedp.CSS("#replay-selected")), chromedp.WaitVisible(chromedp.CSS("#summary")))
	if got := text(t, ctx, "#summary"); got != "Replay: 1 of 3 done." {
		t.Errorf("replay of the selected: %q", got)
	}
	results := text(t, ctx, "#results tbody")
	for _, want := range []string{"evt_dead_2\treplayed", "evt_dead_neg\tfailed again (still a dead letter): permanent: negative amount -5", "not replayed: replay github/a1b2c3d4-0000-4000-8000-000000000001: txhook: event has no stored payload"} {
		if !strings.Contains(results, want) {
			t.Errorf("results lack %q:\n%s", want, results)
		}
	}
	screenshot(t, ctx, "console-replay")
	for key, want := range map[string]int{"evt_dead_1": 1, "evt_dead_2": 1, "evt_dead_neg": 0} {
		if n := c.ledger(t, key); n != want {
			t.Errorf("ledger rows for %s = %d, want %d", key, n, want)
		}
	}
	if s := c.status(t, "stripe", "evt_dead_neg"); s != "failed" {
		t.Errorf("evt_dead_neg is %s, want still failed", s)
	}
	if logs := c.logs.String(); !strings.Contains(logs, "txhook console: replay") || !strings.Contains(logs, "key=evt_dead_2") {
		t.Errorf("replay not logged:\n%s", logs)
	}
}

func TestDiscard(t *testing.T) {
	c := setup(t, admin.Config{AllowWrites: true})
	ctx := newTab(t)
	run(t, ctx, chromedp.Navigate(c.url+"/txhook/event?source=stripe&key=evt_dead_neg"), chromedp.WaitVisible(chromedp.CSS("#discard")),
		chromedp.Click(chromedp.CSS("#discard")), chromedp.WaitVisible(chromedp.CSS("#summary")))
	if got := text(t, ctx, "#summary"); got != "Discard: 1 of 1 done." {
		t.Errorf("discard summary = %q", got)
	}
	if s := c.status(t, "stripe", "evt_dead_neg"); s != "absent" {
		t.Errorf("discarded event is %s", s)
	}
	if s := c.status(t, "stripe", "evt_dead_2"); s != "failed" {
		t.Errorf("another dead letter is %s", s)
	}
}

// formToken returns a cookie-keeping HTTP client with the CSRF token of a
// page.
func formToken(t *testing.T, url string) (*http.Client, string) {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	cl := &http.Client{Jar: jar}
	return cl, pageToken(t, cl, url)
}

// pageToken returns the CSRF token of the page at url, fetched with cl.
func pageToken(t *testing.T, cl *http.Client, url string) string {
	t.Helper()
	resp, err := cl.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("no CSRF token on %s", url)
	}
	return string(m[1])
}

func post(t *testing.T, cl *http.Client, u string, form url.Values) (int, string) {
	t.Helper()
	resp, err := cl.PostForm(u, form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// deadLetterID returns the form value naming a dead letter, as the page has it.
func deadLetterID(t *testing.T, ctx context.Context, c *console, key string) string {
	t.Helper()
	run(t, ctx, chromedp.Navigate(c.url+"/txhook/event?source=stripe&key="+key), chromedp.WaitVisible(chromedp.CSS("#fields")))
	if count(t, ctx, `input[name="one"]`) == 0 {
		return ""
	}
	a, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS(`input[name="one"]`), "value"))
	if err != nil {
		t.Fatal(err)
	}
	return a.Value
}

func TestWritesNeedTheCSRFToken(t *testing.T) {
	c := setup(t, admin.Config{AllowWrites: true})
	ctx := newTab(t)
	id := deadLetterID(t, ctx, c, "evt_dead_1")
	if id == "" {
		t.Fatal("no replay form on a dead letter of a console that allows writes")
	}
	cl, token := formToken(t, c.url+"/txhook/dead-letters")
	for name, form := range map[string]url.Values{
		"no token":    {"one": {id}},
		"wrong token": {"one": {id}, "csrf": {strings.Repeat("ab", 32)}},
	} {
		for _, action := range []string{"replay", "discard"} {
			if code, body := post(t, cl, c.url+"/txhook/"+action, form); code != http.StatusForbidden || !strings.Contains(body, "CSRF") {
				t.Errorf("%s with %s: %d, want 403 naming the CSRF token", action, name, code)
			}
		}
	}
	// A token without its cookie (another client) is refused too.
	if code, _ := post(t, http.DefaultClient, c.url+"/txhook/replay", url.Values{"one": {id}, "csrf": {token}}); code != http.StatusForbidden {
		t.Errorf("token without its cookie: %d, want 403", code)
	}
	// A cross-site POST is refused even with the token.
	req, _ := http.NewRequest(http.MethodPost, c.url+"/txhook/replay", strings.NewReader(url.Values{"one": {id}, "csrf": {token}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	if resp, err := cl.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("cross-site POST: %v %v, want 403", resp.StatusCode, err)
	}
	if n, s := c.ledger(t, "evt_dead_1"), c.status(t, "stripe", "evt_dead_1"); n != 0 || s != "failed" {
		t.Fatalf("a refused write changed something: ledger %d, status %s", n, s)
	}
	// The same POST with its token and cookie goes through.
	if code, body := post(t, cl, c.url+"/txhook/replay", url.Values{"one": {id}, "csrf": {token}}); code != http.StatusOK || !strings.Contains(body, "replayed") {
		t.Errorf("POST with the token: %d\n%s", code, body)
	}
	if n := c.ledger(t, "evt_dead_1"); n != 1 {
		t.Errorf("ledger rows after the replay = %d, want 1", n)
	}
}

func TestReadOnlyConsole(t *testing.T) {
	c := setup(t, admin.Config{}) // AllowWrites off
	ctx := newTab(t)
	run(t, ctx, chromedp.Navigate(c.url+"/txhook/dead-letters"), chromedp.WaitVisible(chromedp.CSS("#events")))
	if n := count(t, ctx, "button, input[type=checkbox]"); n != 1 { // the filter form's button only
		t.Errorf("read-only dead letters page has %d buttons and boxes, want only the filter's", n)
	}
	if got := text(t, ctx, "header .mode"); got != "read-only" {
		t.Errorf("mode = %q", got)
	}
	screenshot(t, ctx, "console-read-only")
	run(t, ctx, chromedp.Navigate(c.url+"/txhook/event?source=stripe&key=evt_dead_1"), chromedp.WaitVisible(chromedp.CSS("#fields")))
	if n := count(t, ctx, "form[method=post], button"); n != 0 {
		t.Errorf("read-only event page has %d write forms or buttons", n)
	}
	// A write with a valid token is still refused.
	cl, token := formToken(t, c.url+"/txhook/dead-letters")
	id := "c3RyaXBl.ZXZ0X2RlYWRfMQ" // stripe / evt_dead_1
	for _, action := range []string{"replay", "discard"} {
		if code, body := post(t, cl, c.url+"/txhook/"+action, url.Values{"one": {id}, "csrf": {token}}); code != http.StatusForbidden || !strings.Contains(body, "read-only") {
			t.Errorf("%s on a read-only console: %d, want 403 read-only", action, code)
		}
	}
	if n, s := c.ledger(t, "evt_dead_1"), c.status(t, "stripe", "evt_dead_1"); n != 0 || s != "failed" {
		t.Errorf("a read-only console changed something: ledger %d, status %s", n, s)
	}
}

// Instances serving the console behind one address accept each other's
// forms when they share Config.CSRFKey, and refuse them otherwise.
func TestSharedCSRFKeyAcrossInstances(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	c := setup(t, admin.Config{AllowWrites: true, CSRFKey: key})
	instance := func(cfg *admin.Config) string {
		mux := http.NewServeMux()
		mux.Handle("/txhook/", http.StripPrefix("/txhook", newConsole(t, c.pool, cfg)))
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		return srv.URL
	}
	same := instance(&admin.Config{AllowWrites: true, CSRFKey: key})
	other := instance(&admin.Config{AllowWrites: true})

	cl, token := formToken(t, c.url+"/txhook/dead-letters")
	resp, err := cl.Get(c.url + "/txhook/dead-letters")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	ids := regexp.MustCompile(`name="one" value="([^"]+)"`).FindAllSubmatch(page, 2)
	if len(ids) < 2 {
		t.Fatalf("want two dead letters on the page, found %d", len(ids))
	}
	// The cookie jar keeps cookies per host, not port: both instances get
	// the first one's CSRF cookie, as instances behind one address would.
	if code, body := post(t, cl, other+"/txhook/discard", url.Values{"csrf": {token}, "one": {string(ids[0][1])}}); code != http.StatusForbidden {
		t.Errorf("form posted to an instance with another key: %d %q, want 403", code, body)
	}
	if code, body := post(t, cl, same+"/txhook/discard", url.Values{"csrf": {token}, "one": {string(ids[1][1])}}); code != http.StatusOK {
		t.Errorf("form posted to an instance with the same key: %d %q, want 200", code, body)
	}
}

// A replay answered in flight (another replay or delivery holds the event's
// claim) tells the operator so, and changes nothing.
func TestReplayInFlightMessage(t *testing.T) {
	c := setup(t, admin.Config{AllowWrites: true})
	ctx := t.Context()
	var source, key string
	if err := c.pool.QueryRow(ctx, `SELECT source, event_key FROM txhook_processed_events
		WHERE status = 'failed' AND payload IS NOT NULL ORDER BY event_key LIMIT 1`).Scan(&source, &key); err != nil {
		t.Fatal(err)
	}
	ran := false
	routes := txhook.NewRoutes()
	routes.Lease(source, "", txhook.LeaseHandler{Work: func(context.Context, txhook.Claim, txhook.Event) (txhook.TxFunc, error) {
		ran = true
		return nil, nil
	}})
	proc, err := txhook.NewProcessor(c.pool, &txhook.Config{Routes: routes, LockTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/txhook/", http.StripPrefix("/txhook", newConsole(t, c.pool, &admin.Config{AllowWrites: true, Processor: proc})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	// Another replay's transaction holds the row.
	holder, err := c.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(context.Background())
	if _, err := holder.Exec(ctx, `SELECT 1 FROM txhook_processed_events WHERE source = $1 AND event_key = $2 FOR UPDATE`, source, key); err != nil {
		t.Fatal(err)
	}
	cl, token := formToken(t, srv.URL+"/txhook/dead-letters")
	id := base64.RawURLEncoding.EncodeToString([]byte(source)) + "." + base64.RawURLEncoding.EncodeToString([]byte(key))
	code, body := post(t, cl, srv.URL+"/txhook/replay", url.Values{"csrf": {token}, "one": {id}})
	if code != http.StatusOK || !strings.Contains(body, "another replay or delivery holds the event") {
		t.Errorf("replay of a held event: %d, page without the in-flight message:\n%s", code, body)
	}
	if ran {
		t.Error("the handler ran while another held the event")
	}
}

// newConsole is admin.New, failing t on an error.
func newConsole(t testing.TB, db txhook.Querier, cfg *admin.Config) http.Handler {
	t.Helper()
	h, err := admin.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}
