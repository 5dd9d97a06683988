package handler_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/internal/testdb"
)

// TestBodyDedupeAcrossTypes replays captured bodies under a new id and
// another type, per provider: GitHub's guard identity is the body alone, so
// a body answered ignored or ping cannot come back under a routed type;
// Shopify's is the topic and the body, so two topics of one change with
// byte-identical bodies both run, while a replay under the same topic does
// not.
func TestBodyDedupeAcrossTypes(t *testing.T) {
	t.Parallel()
	gh := &handler.GitHub{Secrets: []string{"gh"}}
	t.Run("github ignored then push", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, handler.Config{Source: "gh", Provider: gh}, pushOnly("gh"))
		body := `{"action":"opened","issue":{"number":7}}`
		e.post(gh, body, "X-GitHub-Delivery", "d-1", "X-GitHub-Event", "issues").want(t, 200, "status", "ignored")
		e.wantCounts(1, 0)
		e.post(gh, body, "X-GitHub-Delivery", "d-2", "X-GitHub-Event", "push").want(t, 200, "status", "duplicate_body")
		e.wantCounts(1, 0)
		// The ignored delivery's own retry is a plain duplicate.
		e.post(gh, body, "X-GitHub-Delivery", "d-1", "X-GitHub-Event", "issues").want(t, 200, "status", "duplicate")
		// A push the other way round: its body cannot come back as issues.
		push := `{"ref":"refs/heads/main","after":"abc"}`
		e.post(gh, push, "X-GitHub-Delivery", "d-3", "X-GitHub-Event", "push").want(t, 200, "status", "processed")
		e.post(gh, push, "X-GitHub-Delivery", "d-4", "X-GitHub-Event", "issues").want(t, 200, "status", "duplicate_body")
		e.wantCounts(2, 1)
	})
	t.Run("github ping then push", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, handler.Config{Source: "gh", Provider: gh}, pushOnly("gh"))
		body := `{"zen":"Design for failure.","hook_id":1}`
		e.post(gh, body, "X-GitHub-Delivery", "d-ping", "X-GitHub-Event", "ping").want(t, 200, "status", "ping")
		e.post(gh, body, "X-GitHub-Delivery", "d-2", "X-GitHub-Event", "push").want(t, 200, "status", "duplicate_body")
		e.wantCounts(1, 0)
	})
	t.Run("github guard off answers ignored without writing", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, handler.Config{Source: "gh", Provider: gh, BodyDedupe: handler.BodyDedupeOff}, pushOnly("gh"))
		e.post(gh, `{}`, "X-GitHub-Delivery", "d-1", "X-GitHub-Event", "issues").want(t, 200, "status", "ignored")
		e.post(gh, `{}`, "X-GitHub-Delivery", "d-2", "X-GitHub-Event", "ping").want(t, 200, "status", "ping")
		e.wantCounts(0, 0)
	})

	shop := &handler.Shopify{Secrets: []string{"shp"}}
	shopRoutes := func() *txhook.Config {
		return &txhook.Config{Routes: routesFor("shop", map[string]txhook.HandlerFunc{
			"products/create": record,
			"products/update": record,
		})}
	}
	t.Run("shopify two topics of one change", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, handler.Config{Source: "shop", Provider: shop}, shopRoutes())
		body := `{"id":632910392,"title":"IPod Nano - 8GB","updated_at":"2026-01-01T00:00:00-05:00"}`
		e.post(shop, body, "X-Shopify-Event-Id", "ev-1", "X-Shopify-Topic", "products/create").want(t, 200, "status", "processed")
		e.post(shop, body, "X-Shopify-Event-Id", "ev-2", "X-Shopify-Topic", "products/update").want(t, 200, "status", "processed")
		e.wantCounts(2, 2)
		// The same topic and body under a third id is a replay.
		e.post(shop, body, "X-Shopify-Event-Id", "ev-3", "X-Shopify-Topic", "products/update").want(t, 200, "status", "duplicate_body")
		e.wantCounts(2, 2)
	})
	t.Run("shopify ignored topic then routed topic", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, handler.Config{Source: "shop", Provider: shop}, shopRoutes())
		body := `{"id":1}`
		e.post(shop, body, "X-Shopify-Event-Id", "ev-1", "X-Shopify-Topic", "products/delete").want(t, 200, "status", "ignored")
		e.post(shop, body, "X-Shopify-Event-Id", "ev-2", "X-Shopify-Topic", "products/delete").want(t, 200, "status", "duplicate_body")
		// Another topic is another identity: Shopify may send it legitimately.
		e.post(shop, body, "X-Shopify-Event-Id", "ev-3", "X-Shopify-Topic", "products/create").want(t, 200, "status", "processed")
		e.wantCounts(2, 1)
	})
}

// TestBodyDedupeHMACTypeHeader: an HMAC provider keyed by a signed body
// field but typed by an unsigned header has the guard on by default, so a
// body answered ignored cannot be sent again under a routed type.
func TestBodyDedupeHMACTypeHeader(t *testing.T) {
	t.Parallel()
	p := &handler.HMAC{Secrets: []string{"h"}, SignatureHeader: "X-Sig", KeyField: "id", TypeHeader: "X-Type"}
	e := newEnv(t, handler.Config{Source: "h", Provider: p},
		&txhook.Config{Routes: routesFor("h", map[string]txhook.HandlerFunc{"account.delete": record})})
	body := `{"id":"evt_1","account":"42","note":"harmless notification"}`
	e.post(p, body, "X-Type", "account.notice").want(t, 200, "status", "ignored")
	e.wantCounts(1, 0)
	e.post(p, body, "X-Type", "account.delete").want(t, 200, "status", "duplicate")
	e.wantCounts(1, 0)
}

// deliverConcurrently posts body signed by gh under n delivery ids at once
// and returns the answers by id.
func deliverConcurrently(t *testing.T, e *env, gh *handler.GitHub, body, eventType string, n int) map[string]int {
	t.Helper()
	var mu sync.Mutex
	answers := map[string]int{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		id := fmt.Sprintf("d-%d", i)
		h := hdr("X-GitHub-Delivery", id, "X-GitHub-Event", eventType)
		if err := gh.Sign(h, []byte(body), now); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			<-start
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, e.srv.URL, strings.NewReader(body))
			if err != nil {
				t.Error(err)
				return
			}
			req.Header = h
			resp, err := e.srv.Client().Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			mu.Lock()
			answers[id] = resp.StatusCode
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	return answers
}

// wantOneRun checks that of the answers exactly one delivery ran and none
// was answered 2xx without being a replay of it or in flight.
func wantOneRun(t *testing.T, e *env, answers map[string]int, runs int64) {
	t.Helper()
	if runs != 1 {
		t.Errorf("the route's work ran %d times for one body, want 1", runs)
	}
	for id, s := range answers {
		if s != 200 && s != 409 {
			t.Errorf("%s: status %d, want 200 (processed or replay) or 409", id, s)
		}
	}
	logs := e.logs.String()
	if got := strings.Count(logs, `"outcome":"processed"`); got != 1 {
		t.Errorf("%d deliveries answered processed, want 1", got)
	}
}

// TestBodyDedupeLeaseConcurrent sends one body under 8 ids at once to a
// lease route: the guard's check runs inside the claim, so the external work
// runs once and every other copy is a replay (or in flight), never a second
// run.
func TestBodyDedupeLeaseConcurrent(t *testing.T) {
	t.Parallel()
	gh := &handler.GitHub{Secrets: []string{"gh"}}
	var runs atomic.Int64
	api := newChargeAPI(t)
	work := func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
		runs.Add(1)
		if err := api.charge(ctx, c.IdempotencyKey("charge")); err != nil {
			return nil, err
		}
		time.Sleep(20 * time.Millisecond) // keep the claim while the others arrive
		return recordLater(ev), nil
	}
	rs := txhook.NewRoutes()
	rs.Lease("gh", "push", txhook.LeaseHandler{Work: work})
	e := newEnv(t, handler.Config{Source: "gh", Provider: gh}, &txhook.Config{Routes: rs})
	answers := deliverConcurrently(t, e, gh, `{"ref":"refs/heads/main","after":"0f1e"}`, "push", 8)
	wantOneRun(t, e, answers, runs.Load())
	api.mu.Lock()
	calls := len(api.calls)
	api.mu.Unlock()
	if calls != 1 {
		t.Errorf("external calls under %d idempotency keys, want 1", calls)
	}
	e.wantCounts(1, 1)
}

// TestBodyDedupeStatementTimeout: a session statement_timeout shorter than
// BodyDedupeLockTimeout cancels the guard's wait for another delivery of the
// same body (57014); that is in flight, never 500.
func TestBodyDedupeStatementTimeout(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	if _, err := d.Pool.Exec(t.Context(), `CREATE TABLE effects (source text, event_key text, event_type text)`); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(d.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = "150ms"
	short, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(short.Close)
	gh := &handler.GitHub{Secrets: []string{"gh"}}
	started, release := make(chan struct{}), make(chan struct{})
	e := newEnvPool(t, d.Pool, short, handler.Config{Source: "gh", Provider: gh, BodyDedupeLockTimeout: 5 * time.Second},
		&txhook.Config{Routes: routesFor("gh", map[string]txhook.HandlerFunc{"push": func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
			if ev.Key == "d-1" {
				close(started)
				<-release
			}
			return record(ctx, tx, ev)
		}})})
	body := `{"ref":"refs/heads/main","after":"9a9a"}`
	first := postAsyncGitHub(e, gh, body, "d-1")
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("first delivery never reached its handler")
	}
	r := e.post(gh, body, "X-GitHub-Delivery", "d-2", "X-GitHub-Event", "push")
	close(release)
	r.want(t, http.StatusConflict, "error", "in_flight")
	if s := waitStatus(t, first); s != 200 {
		t.Errorf("first delivery: status %d", s)
	}
}

// postAsyncGitHub delivers body under id from another goroutine; the status
// arrives on the returned channel (0 when the request failed).
func postAsyncGitHub(e *env, gh *handler.GitHub, body, id string) <-chan int {
	ch := make(chan int, 1)
	h := hdr("X-GitHub-Delivery", id, "X-GitHub-Event", "push")
	if err := gh.Sign(h, []byte(body), now); err != nil {
		e.t.Fatal(err)
	}
	go func() {
		req, err := http.NewRequest(http.MethodPost, e.srv.URL, strings.NewReader(body))
		if err != nil {
			ch <- 0
			return
		}
		req.Header = h
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			ch <- 0
			return
		}
		resp.Body.Close()
		ch <- resp.StatusCode
	}()
	return ch
}

// pushOnly is a processor configuration with one route: source's pushes.
func pushOnly(source string) *txhook.Config {
	return &txhook.Config{Routes: routesFor(source, map[string]txhook.HandlerFunc{"push": record})}
}
