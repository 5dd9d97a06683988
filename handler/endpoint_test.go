package handler_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// now is the fixed clock of every endpoint under test.
var now = time.Unix(1750000000, 0)

// env is one test's server, database and endpoint.
type env struct {
	t    *testing.T
	pool *pgxpool.Pool
	srv  *httptest.Server
	logs *syncBuffer
	reps *reports
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

type reports struct {
	mu   sync.Mutex
	list []handler.Report
}

func (r *reports) ObserveDelivery(_ context.Context, rep handler.Report) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.list = append(r.list, rep)
}

func (r *reports) last(t *testing.T) handler.Report {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.list) == 0 {
		t.Fatal("no delivery reported")
	}
	return r.list[len(r.list)-1]
}

// record is the business write every test route makes.
func record(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (source, event_key, event_type) VALUES ($1, $2, $3)`,
		ev.Source, ev.Key, ev.Type)
	return err
}

// testRoutes are the handlers, by type, of the endpoints under test.
func testRoutes() map[string]txhook.HandlerFunc {
	return map[string]txhook.HandlerFunc{
		"invoice.paid":  record,
		"push":          record,
		"orders/create": record,
		"handler.error": func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
			if err := record(ctx, tx, ev); err != nil {
				return err
			}
			return errors.New("downstream said no (secret detail)")
		},
		"handler.permanent": func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
			if err := record(ctx, tx, ev); err != nil {
				return err
			}
			return txhook.Permanent(errors.New("unknown account"))
		},
		"commit.unknown": func(context.Context, pgx.Tx, txhook.Event) error {
			return &txhook.CommitUnknownError{Err: io.ErrUnexpectedEOF}
		},
	}
}

// routesFor registers hs, by type, as source's transactional routes.
func routesFor(source string, hs map[string]txhook.HandlerFunc) *txhook.Routes {
	rs := txhook.NewRoutes()
	for typ, h := range hs {
		rs.Transactional(source, typ, h)
	}
	return rs
}

// fallbackOnly is a processor configuration with one route: source's
// fallback, which records the event.
func fallbackOnly(source string) *txhook.Config {
	return &txhook.Config{Routes: routesFor(source, map[string]txhook.HandlerFunc{"": record})}
}

// newEnv starts a server with the endpoint cfg (Source, Provider and the
// defaults of the tests filled in; the Observer, when cfg has none) on a
// fresh database. Without
// pcfg.Routes, the processor has testRoutes for cfg.Source.
func newEnv(t *testing.T, cfg handler.Config, pcfg *txhook.Config) *env {
	t.Helper()
	d := testdb.New(t)
	if _, err := d.Pool.Exec(t.Context(), `CREATE TABLE effects (
		source text NOT NULL, event_key text NOT NULL, event_type text NOT NULL,
		UNIQUE (source, event_key))`); err != nil {
		t.Fatal(err)
	}
	return newEnvPool(t, d.Pool, d.Pool, cfg, pcfg)
}

func newEnvPool(t *testing.T, pool, procDB *pgxpool.Pool, cfg handler.Config, pcfg *txhook.Config) *env {
	t.Helper()
	e := &env{t: t, pool: pool, logs: &syncBuffer{}, reps: &reports{}}
	var pc txhook.Config
	if pcfg != nil {
		pc = *pcfg
	}
	if pc.Routes == nil {
		pc.Routes = routesFor(cfg.Source, testRoutes())
	}
	proc, err := txhook.NewProcessor(procDB, &pc)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if cfg.Observer == nil { // a test's own observer, or the reports every other test reads
		cfg.Observer = e.reps
	}
	cfg.Now = func() time.Time { return now }
	ep, err := handler.New(proc, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewServer(ep)
	t.Cleanup(e.srv.Close)
	return e
}

type response struct {
	status int
	header http.Header
	body   map[string]string
}

func (e *env) do(method string, h http.Header, body string) response {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), waitBound)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, e.srv.URL, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	r := response{status: resp.StatusCode, header: resp.Header}
	if err := json.Unmarshal(raw, &r.body); err != nil {
		e.t.Fatalf("response body %q is not a JSON object: %v", raw, err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		e.t.Errorf("Content-Type = %q", ct)
	}
	return r
}

// post sends body signed by p (when p is not nil) with extra headers.
func (e *env) post(p handler.Signer, body string, extra ...string) response {
	e.t.Helper()
	h := hdr(extra...)
	if p != nil {
		if err := p.Sign(h, []byte(body), now); err != nil {
			e.t.Fatal(err)
		}
	}
	return e.do(http.MethodPost, h, body)
}

// counts returns the rows in the events table and in the business table.
func (e *env) counts() (events, effects int) {
	e.t.Helper()
	err := e.pool.QueryRow(context.Background(),
		`SELECT (SELECT count(*) FROM txhook_processed_events), (SELECT count(*) FROM effects)`).Scan(&events, &effects)
	if err != nil {
		e.t.Fatal(err)
	}
	return events, effects
}

func (e *env) wantCounts(events, effects int) {
	e.t.Helper()
	ev, ef := e.counts()
	if ev != events || ef != effects {
		e.t.Errorf("rows: %d events, %d effects; want %d, %d", ev, ef, events, effects)
	}
}

func (r response) want(t *testing.T, status int, field, value string) {
	t.Helper()
	if r.status != status || r.body[field] != value {
		t.Errorf("answer %d %v, want %d with %s=%q", r.status, r.body, status, field, value)
	}
}

func stripeEvent(id, typ string) string {
	idJSON, _ := json.Marshal(id)
	typeJSON, _ := json.Marshal(typ)
	return fmt.Sprintf(`{"id":%s,"object":"event","type":%s,"data":{"object":{"amount":4200,"description":"payload-marker-7f3c"}}}`, idJSON, typeJSON)
}

const stripeSecret = "whsec_e2e_secret_value"

func stripeEnv(t *testing.T, cfg handler.Config, pcfg *txhook.Config) (*env, *handler.Stripe) {
	t.Helper()
	p := &handler.Stripe{Secrets: []string{stripeSecret}}
	cfg.Source = "stripe"
	cfg.Provider = p
	return newEnv(t, cfg, pcfg), p
}

// TestStatusTable walks every row of the status table through a real HTTP
// server and PostgreSQL, checking the answer and the rows written.
func TestStatusTable(t *testing.T) {
	t.Parallel()
	e, p := stripeEnv(t, handler.Config{MaxBodyBytes: 4096}, nil)

	t.Run("processed", func(t *testing.T) {
		e.t = t
		e.post(p, stripeEvent("evt_1", "invoice.paid")).want(t, 200, "status", "processed")
		e.wantCounts(1, 1)
		if r := e.reps.last(t); r.Answer != handler.AnswerProcessed || r.Key != "evt_1" || r.Type != "invoice.paid" || r.Status != 200 {
			t.Errorf("report = %+v", r)
		}
	})
	t.Run("duplicate", func(t *testing.T) {
		e.t = t
		e.post(p, stripeEvent("evt_1", "invoice.paid")).want(t, 200, "status", "duplicate")
		e.wantCounts(1, 1)
	})
	t.Run("permanent failure recorded", func(t *testing.T) {
		e.t = t
		e.post(p, stripeEvent("evt_perm", "handler.permanent")).want(t, 200, "status", "failed")
		// The failed event is recorded; the handler's write is rolled back.
		e.wantCounts(2, 1)
		var status string
		if err := e.pool.QueryRow(t.Context(), `SELECT status FROM txhook_processed_events WHERE event_key = 'evt_perm'`).Scan(&status); err != nil || status != "failed" {
			t.Errorf("status = %q, %v; want failed", status, err)
		}
		e.post(p, stripeEvent("evt_perm", "handler.permanent")).want(t, 200, "status", "duplicate")
	})
	t.Run("unknown type ignored", func(t *testing.T) {
		e.t = t
		e.post(p, stripeEvent("evt_unknown", "customer.created")).want(t, 200, "status", "ignored")
		e.wantCounts(2, 1)
	})
	t.Run("handler error", func(t *testing.T) {
		e.t = t
		r := e.post(p, stripeEvent("evt_err", "handler.error"))
		r.want(t, 500, "error", "error")
		if strings.Contains(fmt.Sprint(r.body), "secret detail") {
			t.Errorf("body leaks the handler's error: %v", r.body)
		}
		e.wantCounts(2, 1)
	})
	t.Run("commit outcome unknown", func(t *testing.T) {
		e.t = t
		e.post(p, stripeEvent("evt_cu", "commit.unknown")).want(t, 503, "error", "unavailable")
		e.wantCounts(2, 1)
	})
	t.Run("missing signature", func(t *testing.T) {
		e.t = t
		e.post(nil, stripeEvent("evt_nosig", "invoice.paid")).want(t, 400, "error", "bad_signature")
		e.wantCounts(2, 1)
	})
	t.Run("wrong signature", func(t *testing.T) {
		e.t = t
		wrong := &handler.Stripe{Secrets: []string{"whsec_attacker"}}
		e.post(wrong, stripeEvent("evt_wrong", "invoice.paid")).want(t, 400, "error", "bad_signature")
		e.wantCounts(2, 1)
	})
	t.Run("stale timestamp", func(t *testing.T) {
		e.t = t
		body := stripeEvent("evt_stale", "invoice.paid")
		h := http.Header{}
		if err := p.Sign(h, []byte(body), now.Add(-10*time.Minute)); err != nil {
			t.Fatal(err)
		}
		e.do(http.MethodPost, h, body).want(t, 400, "error", "stale_timestamp")
		e.wantCounts(2, 1)
	})
	t.Run("malformed body", func(t *testing.T) {
		e.t = t
		e.post(p, `{"id": "evt_x", "type": `).want(t, 400, "error", "bad_request")
		e.post(p, `{"type":"invoice.paid"}`).want(t, 400, "error", "bad_request")
		e.wantCounts(2, 1)
	})
	t.Run("invalid key", func(t *testing.T) {
		e.t = t
		e.post(p, stripeEvent("evt_\u0000nul", "invoice.paid")).want(t, 400, "error", "bad_request")
		if r := e.reps.last(t); !errors.Is(r.Err, txhook.ErrInvalidEvent) {
			t.Errorf("NUL key rejected for %v, want ErrInvalidEvent", r.Err)
		}
		e.post(p, stripeEvent(strings.Repeat("k", 256), "invoice.paid")).want(t, 400, "error", "bad_request")
		e.wantCounts(2, 1)
	})
	t.Run("too large", func(t *testing.T) {
		e.t = t
		big := stripeEvent("evt_big", "invoice.paid") + strings.Repeat(" ", 5000)
		e.post(p, big).want(t, 413, "error", "too_large")
		// Without a Content-Length the limit is hit while reading.
		h := http.Header{}
		if err := p.Sign(h, []byte(big), now); err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, e.srv.URL, io.MultiReader(strings.NewReader(big)))
		req.Header = h
		req.ContentLength = -1
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 413 {
			t.Errorf("chunked: status %d, want 413", resp.StatusCode)
		}
		e.wantCounts(2, 1)
	})
	t.Run("method not allowed", func(t *testing.T) {
		e.t = t
		for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
			r := e.do(m, nil, "")
			r.want(t, 405, "error", "method_not_allowed")
			if got := r.header.Get("Allow"); got != "POST" {
				t.Errorf("%s: Allow = %q", m, got)
			}
		}
		e.wantCounts(2, 1)
	})
	t.Run("logs hold no secret or payload", func(t *testing.T) {
		logs := e.logs.String()
		for _, s := range []string{stripeSecret, `"amount"`, "payload-marker-7f3c"} {
			if strings.Contains(logs, s) {
				t.Errorf("logs contain %q", s)
			}
		}
		for _, s := range []string{`"outcome":"processed"`, `"key":"evt_1"`, `"source":"stripe"`, `"duration"`} {
			if !strings.Contains(logs, s) {
				t.Errorf("logs lack %s", s)
			}
		}
	})
}

// holdKey inserts key in a transaction that stays open until the test ends,
// so that deliveries of key find it in flight.
func holdKey(t *testing.T, pool *pgxpool.Pool, source, key string) {
	t.Helper()
	tx, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	if _, err := tx.Exec(t.Context(), `INSERT INTO txhook_processed_events (source, event_key, status, completed_at)
		VALUES ($1, $2, 'done', now())`, source, key); err != nil {
		t.Fatal(err)
	}
}

func TestInFlight(t *testing.T) {
	t.Parallel()
	pcfg := &txhook.Config{LockTimeout: 100 * time.Millisecond, InFlightRetryAfter: 1500 * time.Millisecond}
	for _, status := range []int{0, http.StatusServiceUnavailable} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			t.Parallel()
			e, p := stripeEnv(t, handler.Config{InFlightStatus: status}, pcfg)
			holdKey(t, e.pool, "stripe", "evt_busy")
			r := e.post(p, stripeEvent("evt_busy", "invoice.paid"))
			want := status
			if want == 0 {
				want = http.StatusConflict
			}
			r.want(t, want, "error", "in_flight")
			if got := r.header.Get("Retry-After"); got != "2" {
				t.Errorf("Retry-After = %q, want 2 (1.5 s rounded up)", got)
			}
			e.wantCounts(0, 0)
		})
	}
}

func TestDatabaseUnreachable(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	if _, err := d.Pool.Exec(t.Context(), `CREATE TABLE effects (source text, event_key text, event_type text)`); err != nil {
		t.Fatal(err)
	}
	// A pool whose server does not listen: every BEGIN fails to connect.
	down, err := pgxpool.New(t.Context(), "postgres://postgres@127.0.0.1:1/none?connect_timeout=2&sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(down.Close)
	for _, tc := range []struct {
		name     string
		provider handler.Provider
		extra    []string
	}{
		{"stripe", &handler.Stripe{Secrets: []string{"whsec_x"}}, nil},
		// The body dedupe (on for GitHub) runs in the transaction that
		// cannot begin.
		{"github", &handler.GitHub{Secrets: []string{"x"}}, []string{"X-GitHub-Delivery", "d-1", "X-GitHub-Event", "push"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnvPool(t, d.Pool, down, handler.Config{Source: tc.name, Provider: tc.provider}, nil)
			r := e.post(tc.provider.(handler.Signer), stripeEvent("evt_down", "push"), tc.extra...)
			r.want(t, 503, "error", "unavailable")
			e.wantCounts(0, 0)
		})
	}
}

// TestConcurrentDuplicates delivers one event from many goroutines at once:
// it is applied once, every answer is 200 or in flight, never an error.
func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	e, p := stripeEnv(t, handler.Config{}, nil)
	body := stripeEvent("evt_race", "invoice.paid")
	var wg sync.WaitGroup
	statuses := make(chan int, 8)
	for range 8 {
		wg.Go(func() {
			h := http.Header{}
			if err := p.Sign(h, []byte(body), now); err != nil {
				t.Error(err)
				return
			}
			ctx, cancel := context.WithTimeout(t.Context(), waitBound)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL, strings.NewReader(body))
			req.Header = h
			resp, err := e.srv.Client().Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			statuses <- resp.StatusCode
		})
	}
	wg.Wait()
	close(statuses)
	ok := 0
	for s := range statuses {
		switch s {
		case 200:
			ok++
		case 409:
		default:
			t.Errorf("status %d", s)
		}
	}
	if ok == 0 {
		t.Error("no delivery answered 200")
	}
	e.wantCounts(1, 1)
}

// TestLongKeyClippedInReports: an oversized key is rejected with 400 and
// reported cut short, not copied whole into logs.
func TestLongKeyClippedInReports(t *testing.T) {
	t.Parallel()
	gh := &handler.GitHub{Secrets: []string{"gh"}}
	e := newEnv(t, handler.Config{Source: "gh", Provider: gh}, nil)
	long := strings.Repeat("é", 50_000)
	e.post(gh, `{}`, "X-GitHub-Delivery", long, "X-GitHub-Event", "push").want(t, 400, "error", "bad_request")
	e.wantCounts(0, 0)
	r := e.reps.last(t)
	if len(r.Key) > 260 || !strings.HasSuffix(r.Key, "…") || !strings.HasPrefix(long, strings.TrimSuffix(r.Key, "…")) {
		t.Errorf("reported key of %d bytes: %q", len(r.Key), r.Key)
	}
	if strings.Contains(e.logs.String(), strings.Repeat("é", 200)) {
		t.Error("logs hold the whole key")
	}
}
