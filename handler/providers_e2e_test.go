package handler_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
)

// TestProvidersEndToEnd delivers one event per provider through a real
// server and PostgreSQL: processed, then a retry answered as a duplicate,
// then a forged delivery rejected.
func TestProvidersEndToEnd(t *testing.T) {
	t.Parallel()
	type provider interface {
		handler.Provider
		handler.Signer
	}
	for _, tc := range []struct {
		name    string
		p, evil provider
		body    string
		headers []string
	}{
		{
			name: "stripe",
			p:    &handler.Stripe{Secrets: []string{"whsec_1"}}, evil: &handler.Stripe{Secrets: []string{"whsec_2"}},
			body: stripeEvent("evt_p1", "invoice.paid"),
		},
		{
			name: "github",
			p:    &handler.GitHub{Secrets: []string{"gh"}}, evil: &handler.GitHub{Secrets: []string{"hg"}},
			body:    `{"ref":"refs/heads/main"}`,
			headers: []string{"X-GitHub-Delivery", "d-1", "X-GitHub-Event", "push"},
		},
		{
			name: "standard",
			p:    &handler.StandardWebhooks{Secrets: []string{"whsec_c2VjcmV0LTE="}}, evil: &handler.StandardWebhooks{Secrets: []string{"whsec_c2VjcmV0LTI="}},
			body:    `{"type":"invoice.paid","data":{}}`,
			headers: []string{"webhook-id", "msg_1"},
		},
		{
			name: "shopify",
			p:    &handler.Shopify{Secrets: []string{"shp"}}, evil: &handler.Shopify{Secrets: []string{"phs"}},
			body:    `{"id":1}`,
			headers: []string{"X-Shopify-Event-Id", "ev-1", "X-Shopify-Webhook-Id", "wh-1", "X-Shopify-Topic", "orders/create"},
		},
		{
			name: "hmac",
			p:    &handler.HMAC{Secrets: []string{"h"}, SignatureHeader: "X-Sig", Prefix: "sha256=", KeyField: "id", TypeField: "event"},
			evil: &handler.HMAC{Secrets: []string{"x"}, SignatureHeader: "X-Sig", Prefix: "sha256=", KeyField: "id", TypeField: "event"},
			body: `{"id":"e-1","event":"push"}`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, handler.Config{Source: tc.name, Provider: tc.p}, nil)
			e.post(tc.evil, tc.body, tc.headers...).want(t, 400, "error", "bad_signature")
			e.wantCounts(0, 0)
			e.post(tc.p, tc.body, tc.headers...).want(t, 200, "status", "processed")
			e.wantCounts(1, 1)
			e.post(tc.p, tc.body, tc.headers...).want(t, 200, "status", "duplicate")
			e.wantCounts(1, 1)
		})
	}
}

// TestSvixHeaders checks that Svix's header names are accepted.
func TestSvixHeaders(t *testing.T) {
	t.Parallel()
	p := &handler.StandardWebhooks{Secrets: []string{"whsec_c2VjcmV0LTE="}}
	e := newEnv(t, handler.Config{Source: "svix", Provider: p}, nil)
	body := `{"type":"invoice.paid"}`
	h := hdr("webhook-id", "msg_svix")
	if err := p.Sign(h, []byte(body), now); err != nil {
		t.Fatal(err)
	}
	svix := hdr("svix-id", h.Get("webhook-id"), "svix-timestamp", h.Get("webhook-timestamp"), "svix-signature", h.Get("webhook-signature"))
	e.do(http.MethodPost, svix, body).want(t, 200, "status", "processed")
	var key string
	if err := e.pool.QueryRow(t.Context(), `SELECT event_key FROM effects`).Scan(&key); err != nil || key != "msg_svix" {
		t.Errorf("key = %q, %v", key, err)
	}
}

func TestGitHubPing(t *testing.T) {
	t.Parallel()
	p := &handler.GitHub{Secrets: []string{"gh"}}
	e := newEnv(t, handler.Config{Source: "github", Provider: p}, nil)
	e.post(p, `{"zen":"Keep it logically awesome.","hook_id":1}`, "X-GitHub-Delivery", "d-ping", "X-GitHub-Event", "ping").
		want(t, 200, "status", "ping")
	// With the body dedupe on (GitHub's default), the ping's key and body
	// hash are recorded; nothing else runs.
	e.wantCounts(1, 0)
	// A ping is still verified.
	e.post(&handler.GitHub{Secrets: []string{"other"}}, `{}`, "X-GitHub-Delivery", "d-ping", "X-GitHub-Event", "ping").
		want(t, 400, "error", "bad_signature")
}

// TestGitHubFormContentType: a webhook configured with GitHub's form
// content type (payload=<urlencoded JSON>) is answered 415, naming the fix,
// with nothing run or written, even when correctly signed; JSON deliveries,
// with or without a Content-Type, are accepted.
func TestGitHubFormContentType(t *testing.T) {
	t.Parallel()
	p := &handler.GitHub{Secrets: []string{"gh"}}
	e := newEnv(t, handler.Config{Source: "github", Provider: p}, nil)
	form := "payload=%7B%22ref%22%3A%22refs%2Fheads%2Fmain%22%7D"
	for _, ct := range []string{"application/x-www-form-urlencoded", "Application/X-WWW-Form-Urlencoded; charset=utf-8"} {
		r := e.post(p, form, "Content-Type", ct, "X-GitHub-Delivery", "d-form", "X-GitHub-Event", "push")
		r.want(t, http.StatusUnsupportedMediaType, "error", "unsupported_media_type")
		if !strings.Contains(r.body["message"], "application/json") {
			t.Errorf("%s: message %q does not name application/json", ct, r.body["message"])
		}
		if rep := e.reps.last(t); rep.Answer != handler.AnswerUnsupportedMediaType || rep.Status != http.StatusUnsupportedMediaType {
			t.Errorf("%s: report = %+v", ct, rep)
		}
	}
	e.post(p, form, "Content-Type", "application/x-www-form-urlencoded", "X-GitHub-Delivery", "d-ping", "X-GitHub-Event", "ping").
		want(t, http.StatusUnsupportedMediaType, "error", "unsupported_media_type")
	e.wantCounts(0, 0)
	for i, ct := range []string{"", "application/json", "application/json; charset=utf-8"} {
		body := fmt.Sprintf(`{"ref":"refs/heads/b%d"}`, i)
		e.post(p, body, "Content-Type", ct, "X-GitHub-Delivery", fmt.Sprint("d-json-", i), "X-GitHub-Event", "push").
			want(t, 200, "status", "processed")
	}
	e.wantCounts(3, 3)
}

// TestBodyDedupe replays a captured body and signature under fresh id
// headers.
func TestBodyDedupe(t *testing.T) {
	t.Parallel()
	gh := &handler.GitHub{Secrets: []string{"gh"}}
	shop := &handler.Shopify{Secrets: []string{"shp"}}
	body := `{"action":"opened","number":7}`
	for _, tc := range []struct {
		name string
		p    interface {
			handler.Provider
			handler.Signer
		}
		guard      handler.BodyDedupeMode
		first, rep []string
		wantReplay bool
	}{
		{"github default", gh, handler.BodyDedupeAuto,
			[]string{"X-GitHub-Delivery", "d-1", "X-GitHub-Event", "push"},
			[]string{"X-GitHub-Delivery", "d-2", "X-GitHub-Event", "push"}, true},
		{"shopify default", shop, handler.BodyDedupeAuto,
			[]string{"X-Shopify-Event-Id", "ev-1", "X-Shopify-Topic", "orders/create"},
			[]string{"X-Shopify-Event-Id", "ev-2", "X-Shopify-Topic", "orders/create"}, true},
		{"github off", gh, handler.BodyDedupeOff,
			[]string{"X-GitHub-Delivery", "d-1", "X-GitHub-Event", "push"},
			[]string{"X-GitHub-Delivery", "d-2", "X-GitHub-Event", "push"}, false},
	} {
		for _, first := range []bool{false, true} {
			name := tc.name
			if first {
				// The guard's lookup is then the statement sent with the
				// dedupe step.
				name += ", dedupe with first statement"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				// The guard runs inside the delivery's transaction.
				e := newEnv(t, handler.Config{Source: "src", Provider: tc.p, BodyDedupe: tc.guard},
					&txhook.Config{DedupeWithFirstStatement: first})
				e.post(tc.p, body, tc.first...).want(t, 200, "status", "processed")
				r := e.post(tc.p, body, tc.rep...)
				if !tc.wantReplay {
					r.want(t, 200, "status", "processed")
					e.wantCounts(2, 2)
					return
				}
				r.want(t, 200, "status", "duplicate_body")
				e.wantCounts(1, 1)
				if !strings.Contains(e.logs.String(), "suspected replay") {
					t.Error("replay not logged")
				}
				// A legitimate redelivery (same id) is still a plain duplicate,
				// and a different body under a new id is processed.
				e.post(tc.p, body, tc.first...).want(t, 200, "status", "duplicate")
				e.post(tc.p, body+" ", tc.rep...).want(t, 200, "status", "processed")
				e.wantCounts(2, 2)
			})
		}
	}

	t.Run("fallback route", func(t *testing.T) {
		t.Parallel()
		// A type without a route of its own goes to the source's fallback,
		// guarded like any other route.
		e := newEnv(t, handler.Config{Source: "gh", Provider: gh},
			&txhook.Config{Routes: routesFor("gh", map[string]txhook.HandlerFunc{"": record})})
		e.post(gh, body, "X-GitHub-Delivery", "d-1", "X-GitHub-Event", "push").want(t, 200, "status", "processed")
		e.post(gh, body, "X-GitHub-Delivery", "d-2", "X-GitHub-Event", "push").want(t, 200, "status", "duplicate_body")
		e.wantCounts(1, 1)
	})
	t.Run("stripe opt in", func(t *testing.T) {
		t.Parallel()
		// Stripe bodies carry their id, so the guard is off by default;
		// switched on, it stores hashes and finds nothing to block.
		e, p := stripeEnv(t, handler.Config{BodyDedupe: handler.BodyDedupeOn}, nil)
		e.post(p, stripeEvent("evt_a", "invoice.paid")).want(t, 200, "status", "processed")
		var n int
		if err := e.pool.QueryRow(t.Context(), `SELECT count(*) FROM txhook_processed_events WHERE payload_hash IS NOT NULL`).Scan(&n); err != nil || n != 1 {
			t.Errorf("hashed rows = %d, %v; want 1", n, err)
		}
	})
	t.Run("outside window", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, handler.Config{Source: "gh", Provider: gh}, nil)
		e.post(gh, body, "X-GitHub-Delivery", "d-old", "X-GitHub-Event", "push").want(t, 200, "status", "processed")
		if _, err := e.pool.Exec(t.Context(), `UPDATE txhook_processed_events SET created_at = now() - interval '15 days'`); err != nil {
			t.Fatal(err)
		}
		e.post(gh, body, "X-GitHub-Delivery", "d-new", "X-GitHub-Event", "push").want(t, 200, "status", "processed")
	})
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	proc, err := txhook.NewProcessor(stubBeginner{}, &txhook.Config{Routes: routesFor("s", map[string]txhook.HandlerFunc{"a": record})})
	if err != nil {
		t.Fatal(err)
	}
	ok := handler.Config{Source: "s", Provider: &handler.Stripe{Secrets: []string{"x"}}}
	if _, err := handler.New(proc, &ok); err != nil {
		t.Fatalf("New(valid) = %v", err)
	}
	for name, mutate := range map[string]func(c *handler.Config){
		"no source":      func(c *handler.Config) { c.Source = "" },
		"NUL source":     func(c *handler.Config) { c.Source = "a\x00" },
		"no provider":    func(c *handler.Config) { c.Provider = nil },
		"no secret":      func(c *handler.Config) { c.Provider = &handler.Stripe{} },
		"bad in-flight":  func(c *handler.Config) { c.InFlightStatus = 200 },
		"negative limit": func(c *handler.Config) { c.MaxBodyBytes = -1 },
		// Every delivery would be acknowledged and none applied.
		"source without routes": func(c *handler.Config) { c.Source = "other" },
		"unknown guard":         func(c *handler.Config) { c.BodyDedupe = 9 },
	} {
		c := ok
		mutate(&c)
		if _, err := handler.New(proc, &c); err == nil {
			t.Errorf("%s: New = nil error", name)
		}
	}
	if _, err := handler.New(nil, &ok); err == nil {
		t.Error("nil processor: New = nil error")
	}
	if _, err := handler.New(proc, nil); err == nil {
		t.Error("nil config: New = nil error")
	}
}

// stubBeginner lets tests build a Processor that never reaches a database.
type stubBeginner struct{}

func (stubBeginner) BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error) {
	return nil, errStub
}

var errStub = &stubError{}

type stubError struct{}

func (*stubError) Error() string { return "stub: no database" }

// TestBodyDedupeConcurrent sends a body under a second key while the first
// delivery of it is still in its transaction: the second waits for the
// first and is answered as a replay.
func TestBodyDedupeConcurrent(t *testing.T) {
	t.Parallel()
	gh := &handler.GitHub{Secrets: []string{"gh"}}
	started := make(chan struct{})
	var release *released // set once the server runs
	e := newEnv(t, handler.Config{Source: "gh", Provider: gh}, &txhook.Config{Routes: routesFor("gh", map[string]txhook.HandlerFunc{
		"push": func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
			if ev.Key == "d-1" {
				close(started)
				<-release.ch
			}
			return record(ctx, tx, ev)
		},
	})})
	release = newReleased(t)
	body := `{"ref":"refs/heads/main","after":"abc"}`
	answers := make(map[string]response)
	var mu sync.Mutex
	var wg sync.WaitGroup
	deliver := func(key string) {
		wg.Go(func() {
			h := hdr("X-GitHub-Delivery", key, "X-GitHub-Event", "push")
			if err := gh.Sign(h, []byte(body), now); err != nil {
				t.Error(err)
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), waitBound)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL, strings.NewReader(body))
			req.Header = h
			resp, err := e.srv.Client().Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			var m map[string]string
			if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
				t.Error(err)
			}
			mu.Lock()
			answers[key] = response{status: resp.StatusCode, body: m}
			mu.Unlock()
		})
	}
	deliver("d-1")
	waitClosed(t, started, "the first delivery's handler to start")
	deliver("d-2")
	// Wait until d-2 waits on the guard's advisory lock.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting int
		if err := e.pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND NOT granted
			  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("second delivery never waited on the guard's lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
	release.free()
	wg.Wait()
	answers["d-1"].want(t, 200, "status", "processed")
	answers["d-2"].want(t, 200, "status", "duplicate_body")
	e.wantCounts(1, 1)
}

// TestDefaultBodyLimit: GitHub's default limit takes a body at its 25 MB
// cap and refuses one past the limit (25 MiB).
func TestDefaultBodyLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("sends 57 MB")
	}
	t.Parallel()
	gh := &handler.GitHub{Secrets: []string{"gh"}}
	e := newEnv(t, handler.Config{Source: "gh", Provider: gh}, nil)
	big := `{"pad":"` + strings.Repeat("x", 25_000_000-10) + `"}`
	e.post(gh, big, "X-GitHub-Delivery", "d-big", "X-GitHub-Event", "push").want(t, 200, "status", "processed")
	huge := big + strings.Repeat(" ", 25<<20-len(big)+1)
	e.post(gh, huge, "X-GitHub-Delivery", "d-huge", "X-GitHub-Event", "push").want(t, 413, "error", "too_large")
	e.wantCounts(1, 1)
}

// TestBodyDedupeWaitIsBounded: a second body-identical delivery under
// another key waits at most BodyDedupeLockTimeout for the first, then is
// answered in flight (never 2xx) with nothing written; once the first has
// committed, its retry is answered as a replay.
func TestBodyDedupeWaitIsBounded(t *testing.T) {
	t.Parallel()
	gh := &handler.GitHub{Secrets: []string{"gh"}}
	started := make(chan struct{})
	var release *released // set once the server runs
	e := newEnv(t, handler.Config{Source: "gh", Provider: gh, BodyDedupeLockTimeout: 100 * time.Millisecond},
		&txhook.Config{Routes: routesFor("gh", map[string]txhook.HandlerFunc{
			"push": func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
				if ev.Key == "d-1" {
					close(started)
					<-release.ch
				}
				return record(ctx, tx, ev)
			},
		})})
	release = newReleased(t)
	body := `{"ref":"refs/heads/main","after":"def"}`
	first := make(chan response, 1)
	go func() {
		h := hdr("X-GitHub-Delivery", "d-1", "X-GitHub-Event", "push")
		if err := gh.Sign(h, []byte(body), now); err != nil {
			t.Error(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitBound)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL, strings.NewReader(body))
		req.Header = h
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			t.Error(err)
			first <- response{}
			return
		}
		defer resp.Body.Close()
		var m map[string]string
		json.NewDecoder(resp.Body).Decode(&m)
		first <- response{status: resp.StatusCode, body: m}
	}()
	waitClosed(t, started, "the first delivery's handler to start")
	r := e.post(gh, body, "X-GitHub-Delivery", "d-2", "X-GitHub-Event", "push")
	r.want(t, http.StatusConflict, "error", "in_flight")
	if r.header.Get("Retry-After") == "" {
		t.Error("in-flight answer without Retry-After")
	}
	release.free()
	select {
	case r := <-first:
		r.want(t, 200, "status", "processed")
	case <-time.After(waitBound):
		t.Fatal("first delivery did not answer")
	}
	e.wantCounts(1, 1)
	e.post(gh, body, "X-GitHub-Delivery", "d-2", "X-GitHub-Event", "push").want(t, 200, "status", "duplicate_body")
	e.wantCounts(1, 1)
}
