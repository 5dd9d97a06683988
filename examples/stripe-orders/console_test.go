package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/examples/stripe-orders/ordersdb"
	"github.com/txhook/txhook/internal/testdb"
)

// get fetches url with the client and returns the status and body.
func get(t *testing.T, cl *http.Client, u, user, pass string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestConsoleOnlyWithAPassword(t *testing.T) {
	t.Parallel()
	tdb := testdb.New(t, template)
	h, _, err := newHandler(tdb.Pool, config{DatabaseURL: tdb.URL, WebhookSecret: testSecret}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	if code, _ := get(t, http.DefaultClient, srv.URL+"/txhook/", "admin", ""); code != http.StatusNotFound {
		t.Errorf("console without CONSOLE_PASSWORD: %d, want 404 (not mounted)", code)
	}
}

func TestConsoleBehindBasicAuthReplays(t *testing.T) {
	t.Parallel()
	tdb := testdb.New(t, template)
	h, _, err := newHandler(tdb.Pool, config{DatabaseURL: tdb.URL, WebhookSecret: testSecret, ConsolePassword: "s3cret pw"},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	f := &fixture{db: tdb, q: ordersdb.New(tdb.Pool), url: srv.URL + "/webhooks/stripe"}

	for _, c := range []struct{ user, pass string }{{"", ""}, {"admin", "wrong"}, {"root", "s3cret pw"}} {
		if code, _ := get(t, http.DefaultClient, srv.URL+"/txhook/", c.user, c.pass); code != http.StatusUnauthorized {
			t.Errorf("console as %q/%q: %d, want 401", c.user, c.pass, code)
		}
	}

	// A checkout without its amount is a dead letter; the stored payload is
	// then completed, standing in for the handler fix an operator would
	// deploy, and the console replays it.
	body := checkout(t, "evt_console", "cs_console", "cus_console", nil)
	s, o := f.deliver(t, body)
	wantAnswer(t, s, o, 200, "failed")
	if _, err := tdb.Pool.Exec(t.Context(), `UPDATE txhook_processed_events SET payload = $1 WHERE event_key = 'evt_console'`,
		checkout(t, "evt_console", "cs_console", "cus_console", 4200)); err != nil {
		t.Fatal(err)
	}

	jar, _ := cookiejar.New(nil)
	cl := &http.Client{Jar: jar, Timeout: 30 * time.Second}
	code, page := get(t, cl, srv.URL+"/txhook/dead-letters", "admin", "s3cret pw")
	if code != http.StatusOK || !strings.Contains(page, "evt_console") || !strings.Contains(page, `class="replay-one"`) {
		t.Fatalf("dead letters page: %d\n%s", code, page)
	}
	token := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindStringSubmatch(page)
	id := regexp.MustCompile(`name="one" value="([^"]+)" formaction="replay" data-key="evt_console"`).FindStringSubmatch(page)
	if token == nil || id == nil {
		t.Fatalf("no token or replay button:\n%s", page)
	}
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL+"/txhook/replay",
		strings.NewReader(url.Values{"csrf": {token[1]}, "one": {id[1]}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth("admin", "s3cret pw")
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "replayed: processed") {
		t.Fatalf("replay: %d\n%s", resp.StatusCode, b)
	}
	if n := f.count(t, "SELECT count(*) FROM orders WHERE checkout_session_id = 'cs_console'"); n != 1 {
		t.Errorf("orders after the console's replay = %d, want 1", n)
	}
	if got := f.total(t, "cus_console"); got != 4200 {
		t.Errorf("customer total after the replay = %d, want 4200 (once)", got)
	}
}
