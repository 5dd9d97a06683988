package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
	examplemigrations "github.com/txhook/txhook/examples/stripe-orders/migrations"
	"github.com/txhook/txhook/examples/stripe-orders/ordersdb"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/internal/pgtrace"
	"github.com/txhook/txhook/internal/rabbittest"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/migrations"
)

// runMainEnv makes the test binary run the example's main instead of the
// tests, so that process tests need no separate build.
const runMainEnv = "STRIPE_ORDERS_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	rabbittest.Main(m) // testdb's PostgreSQL, and a RabbitMQ node if the tests started one
}

// template is a database with txhook's migrations and the example's.
var template = testdb.Template{
	Name:  "stripe_orders",
	Files: []fs.FS{migrations.FS, examplemigrations.FS},
	Migrate: func(ctx context.Context, url string) error {
		if err := migrations.Up(ctx, url); err != nil {
			return err
		}
		return examplemigrations.Up(ctx, url)
	},
}

const testSecret = "whsec_test_secret"

// fixture is the example's real handler wiring on a private database,
// served by an httptest server.
type fixture struct {
	db   *testdb.DB
	q    *ordersdb.Queries
	url  string
	proc *txhook.Processor
}

func setup(t *testing.T, fulfillmentURL string) *fixture {
	t.Helper()
	tdb := testdb.New(t, template)
	h, proc, err := newHandler(tdb.Pool, config{
		DatabaseURL:    tdb.URL,
		WebhookSecret:  testSecret,
		FulfillmentURL: fulfillmentURL,
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &fixture{db: tdb, q: ordersdb.New(tdb.Pool), url: srv.URL + "/webhooks/stripe", proc: proc}
}

// stripeEventBody returns a Stripe event's JSON.
func stripeEventBody(t testing.TB, id, typ string, object map[string]any) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{
		"id": id, "object": "event", "type": typ, "created": time.Now().Unix(),
		"data": map[string]any{"object": object},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// deliver POSTs body to url signed with secret and returns the status and
// the answer's "status" (or "error") field.
func deliver(t testing.TB, url, secret string, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if secret != "" {
		if err := (&handler.Stripe{Secrets: []string{secret}}).Sign(req.Header, body, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("deliver: %v", err)
	}
	defer resp.Body.Close()
	var v struct{ Status, Error string }
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("answer %d is not JSON: %q", resp.StatusCode, b)
	}
	return resp.StatusCode, v.Status + v.Error
}

func (f *fixture) deliver(t testing.TB, body []byte) (int, string) {
	t.Helper()
	return deliver(t, f.url, testSecret, body)
}

func checkout(t testing.TB, eventID, session string, customer any, amount any) []byte {
	return stripeEventBody(t, eventID, "checkout.session.completed", map[string]any{
		"id": session, "object": "checkout.session", "customer": customer, "amount_total": amount,
	})
}

func invoiceEvent(t testing.TB, eventID, typ, id string, amount int64) []byte {
	return stripeEventBody(t, eventID, typ, map[string]any{
		"id": id, "object": "invoice", "customer": "cus_1", "amount_due": amount,
	})
}

func wantAnswer(t testing.TB, gotStatus int, gotOutcome string, wantStatus int, wantOutcome string) {
	t.Helper()
	if gotStatus != wantStatus || gotOutcome != wantOutcome {
		t.Fatalf("answer = %d %q, want %d %q", gotStatus, gotOutcome, wantStatus, wantOutcome)
	}
}

func (f *fixture) total(t testing.TB, customer string) int64 {
	t.Helper()
	c, err := f.q.GetCustomer(t.Context(), customer)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return c.TotalSpent
}

func (f *fixture) count(t testing.TB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := f.db.Pool.QueryRow(t.Context(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// written counts every row the example or txhook could have written.
func (f *fixture) written(t testing.TB) int {
	return f.count(t, `SELECT (SELECT count(*) FROM orders) + (SELECT count(*) FROM customers)
		+ (SELECT count(*) FROM invoices) + (SELECT count(*) FROM shipments)
		+ (SELECT count(*) FROM txhook_processed_events)`)
}

func TestCheckoutSessionCompletedOnce(t *testing.T) {
	t.Parallel()
	f := setup(t, "")

	s, o := f.deliver(t, checkout(t, "evt_1", "cs_1", "cus_1", 4200))
	wantAnswer(t, s, o, 200, "processed")
	s, o = f.deliver(t, checkout(t, "evt_1", "cs_1", "cus_1", 4200))
	wantAnswer(t, s, o, 200, "duplicate")
	if got := f.total(t, "cus_1"); got != 4200 {
		t.Fatalf("total after a redelivery = %d, want 4200", got)
	}

	s, o = f.deliver(t, checkout(t, "evt_2", "cs_2", "cus_1", 1800))
	wantAnswer(t, s, o, 200, "processed")
	if got := f.total(t, "cus_1"); got != 6000 {
		t.Fatalf("total = %d, want 6000", got)
	}
	order, err := f.q.GetOrder(t.Context(), "cs_2")
	if err != nil {
		t.Fatal(err)
	}
	if order.CustomerID.String != "cus_1" || order.AmountTotal != 1800 {
		t.Fatalf("order = %+v", order)
	}
	if n := f.count(t, "SELECT count(*) FROM txhook_processed_events WHERE source = 'stripe' AND status = 'done'"); n != 2 {
		t.Fatalf("done events = %d, want 2", n)
	}
}

func TestCheckoutSessionCompletedConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	f := setup(t, "")
	body := checkout(t, "evt_c", "cs_c", "cus_c", 1000)
	var wg sync.WaitGroup
	outcomes := make([]string, 10)
	for i := range outcomes {
		wg.Go(func() {
			s, o := f.deliver(t, body)
			outcomes[i] = fmt.Sprint(s, " ", o)
		})
	}
	wg.Wait()
	processed := 0
	for _, o := range outcomes {
		switch o {
		case "200 processed":
			processed++
		case "200 duplicate", "409 in_flight":
		default:
			t.Errorf("unexpected answer %q", o)
		}
	}
	if processed != 1 {
		t.Fatalf("processed %d times, want 1: %v", processed, outcomes)
	}
	if got := f.total(t, "cus_c"); got != 1000 {
		t.Fatalf("total = %d, want 1000", got)
	}
}

func TestGuestCheckout(t *testing.T) {
	t.Parallel()
	f := setup(t, "")
	s, o := f.deliver(t, checkout(t, "evt_g", "cs_g", nil, 900))
	wantAnswer(t, s, o, 200, "processed")
	order, err := f.q.GetOrder(t.Context(), "cs_g")
	if err != nil {
		t.Fatal(err)
	}
	if order.CustomerID.Valid || order.AmountTotal != 900 {
		t.Fatalf("order = %+v, want no customer and 900", order)
	}
	if n := f.count(t, "SELECT count(*) FROM customers"); n != 0 {
		t.Fatalf("customers = %d, want 0", n)
	}
}

func TestInvoiceTransitions(t *testing.T) {
	t.Parallel()
	status := func(f *fixture, id string) string {
		t.Helper()
		in, err := f.q.GetInvoice(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		return in.Status
	}
	t.Run("in order", func(t *testing.T) {
		t.Parallel()
		f := setup(t, "")
		s, o := f.deliver(t, invoiceEvent(t, "evt_c1", "invoice.created", "in_1", 500))
		wantAnswer(t, s, o, 200, "processed")
		if got := status(f, "in_1"); got != "pending" {
			t.Fatalf("status after created = %q", got)
		}
		s, o = f.deliver(t, invoiceEvent(t, "evt_p1", "invoice.paid", "in_1", 500))
		wantAnswer(t, s, o, 200, "processed")
		if got := status(f, "in_1"); got != "paid" {
			t.Fatalf("status after paid = %q", got)
		}
		// Defence in depth: even under a new event id (as if dedupe were
		// bypassed) a late invoice.created does not reopen the invoice.
		s, o = f.deliver(t, invoiceEvent(t, "evt_c1_again", "invoice.created", "in_1", 500))
		wantAnswer(t, s, o, 200, "processed")
		if got := status(f, "in_1"); got != "paid" {
			t.Fatalf("status after a second created = %q, want paid", got)
		}
	})
	t.Run("paid before created", func(t *testing.T) {
		t.Parallel()
		f := setup(t, "")
		s, o := f.deliver(t, invoiceEvent(t, "evt_p2", "invoice.paid", "in_2", 700))
		wantAnswer(t, s, o, 200, "processed")
		if got := status(f, "in_2"); got != "paid" {
			t.Fatalf("status after paid = %q, want paid", got)
		}
		s, o = f.deliver(t, invoiceEvent(t, "evt_c2", "invoice.created", "in_2", 700))
		wantAnswer(t, s, o, 200, "processed")
		in, err := f.q.GetInvoice(t.Context(), "in_2")
		if err != nil {
			t.Fatal(err)
		}
		if in.Status != "paid" || in.AmountDue != 700 || in.CustomerID != "cus_1" {
			t.Fatalf("invoice = %+v, want paid", in)
		}
	})
}

func TestOtherTypesAcknowledged(t *testing.T) {
	t.Parallel()
	f := setup(t, "") // no FULFILLMENT_URL: payment_intent.succeeded is not routed either
	for _, typ := range []string{"customer.created", "payment_intent.succeeded"} {
		s, o := f.deliver(t, stripeEventBody(t, "evt_"+typ, typ, map[string]any{"id": "x", "amount": 1}))
		wantAnswer(t, s, o, 200, "ignored")
	}
	if n := f.written(t); n != 0 {
		t.Fatalf("%d rows written for ignored events", n)
	}
}

func TestRejectedDeliveriesWriteNothing(t *testing.T) {
	t.Parallel()
	f := setup(t, "")
	body := checkout(t, "evt_r", "cs_r", "cus_r", 100)
	s, o := deliver(t, f.url, "whsec_wrong", body)
	wantAnswer(t, s, o, 400, "bad_signature")
	s, o = deliver(t, f.url, "", body)
	wantAnswer(t, s, o, 400, "bad_signature")
	s, o = f.deliver(t, []byte(`{"type":"checkout.session.completed"}`))
	wantAnswer(t, s, o, 400, "bad_request")
	if n := f.written(t); n != 0 {
		t.Fatalf("%d rows written for rejected deliveries", n)
	}
}

func TestUnusablePayloadRecordedAsFailed(t *testing.T) {
	t.Parallel()
	f := setup(t, "")
	body := checkout(t, "evt_bad", "cs_bad", "cus_bad", nil) // no amount_total
	s, o := f.deliver(t, body)
	wantAnswer(t, s, o, 200, "failed")
	var status string
	var payload []byte
	err := f.db.Pool.QueryRow(t.Context(),
		"SELECT status, payload FROM txhook_processed_events WHERE source = 'stripe' AND event_key = 'evt_bad'").Scan(&status, &payload)
	if err != nil {
		t.Fatal(err)
	}
	if status != "failed" || !bytes.Equal(payload, body) {
		t.Fatalf("event = %s with payload %q, want failed with the body kept for replay", status, payload)
	}
	if n := f.count(t, "SELECT count(*) FROM orders"); n != 0 {
		t.Fatalf("orders = %d, want 0", n)
	}
}

// fulfillmentService stands in for the external fulfillment API: it counts
// calls per Idempotency-Key and fails the first failFirst calls.
type fulfillmentService struct {
	mu        sync.Mutex
	calls     map[string]int
	bodies    []string
	failFirst int
}

func (s *fulfillmentService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[r.Header.Get("Idempotency-Key")]++
	s.bodies = append(s.bodies, string(b))
	if s.failFirst > 0 {
		s.failFirst--
		http.Error(w, "try later", http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

func TestPaymentIntentFulfilledOnce(t *testing.T) {
	t.Parallel()
	svc := &fulfillmentService{calls: map[string]int{}, failFirst: 1}
	ext := httptest.NewServer(svc)
	t.Cleanup(ext.Close)
	f := setup(t, ext.URL+"/ship")
	body := stripeEventBody(t, "evt_pi", "payment_intent.succeeded", map[string]any{"id": "pi_1", "object": "payment_intent", "amount": 2500})

	// The service fails: Stripe is told to retry and nothing is recorded.
	s, o := f.deliver(t, body)
	wantAnswer(t, s, o, 500, "error")
	if n := f.count(t, "SELECT count(*) FROM shipments"); n != 0 {
		t.Fatalf("shipments after a failed call = %d", n)
	}
	// Stripe's retry claims the event at once and ships.
	s, o = f.deliver(t, body)
	wantAnswer(t, s, o, 200, "processed")
	s, o = f.deliver(t, body)
	wantAnswer(t, s, o, 200, "duplicate")

	key := txhook.IdempotencyKey("stripe", "evt_pi", fulfillmentStep)
	svc.mu.Lock()
	defer svc.mu.Unlock()
	if len(svc.calls) != 1 || svc.calls[key] != 2 {
		t.Fatalf("calls by idempotency key = %v, want 2 calls (one failed) all with %s", svc.calls, key)
	}
	if want := `{"payment_intent":"pi_1","amount":2500}`; svc.bodies[1] != want {
		t.Fatalf("request body = %s, want %s", svc.bodies[1], want)
	}
	sh, err := f.q.GetShipment(t.Context(), "pi_1")
	if err != nil {
		t.Fatal(err)
	}
	if sh.Amount != 2500 || sh.IdempotencyKey != key {
		t.Fatalf("shipment = %+v", sh)
	}
}

func TestLoadConfig(t *testing.T) {
	t.Parallel()
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	c, err := loadConfig(env("DATABASE_URL", "postgres://x", "STRIPE_WEBHOOK_SECRET", "whsec_a"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Addr != "127.0.0.1:8080" || c.FulfillmentURL != "" {
		t.Fatalf("defaults = %+v", c)
	}
	_, err = loadConfig(env())
	if err == nil || !strings.Contains(err.Error(), "DATABASE_URL is required") || !strings.Contains(err.Error(), "STRIPE_WEBHOOK_SECRET is required") {
		t.Fatalf("empty environment: err = %v, want both required settings named", err)
	}
	_, err = loadConfig(env("DATABASE_URL", "postgres://x", "STRIPE_WEBHOOK_SECRET", "whsec_a", "FULFILLMENT_URL", "ftp://x"))
	if err == nil || !strings.Contains(err.Error(), "FULFILLMENT_URL") {
		t.Fatalf("bad FULFILLMENT_URL: err = %v", err)
	}
	_, err = loadConfig(env("DATABASE_URL", "postgres://x", "STRIPE_WEBHOOK_SECRET", "whsec_a", "AMQP_URL", "http://127.0.0.1:5672/"))
	if err == nil || !strings.Contains(err.Error(), "AMQP_URL") {
		t.Fatalf("bad AMQP_URL: err = %v", err)
	}
	c, err = loadConfig(env("DATABASE_URL", "postgres://x", "STRIPE_WEBHOOK_SECRET", "whsec_a", "AMQP_URL", " amqp://guest:guest@127.0.0.1:5672/ "))
	if err != nil || c.AMQPURL != "amqp://guest:guest@127.0.0.1:5672/" {
		t.Fatalf("AMQP_URL: %+v, %v", c, err)
	}
	if got := splitSecrets(" whsec_a, ,whsec_b "); len(got) != 2 || got[0] != "whsec_a" || got[1] != "whsec_b" {
		t.Fatalf("splitSecrets = %q", got)
	}
}

// TestCheckoutRoundTrips: a new checkout.session.completed costs the example
// one round trip (BEGIN, the dedupe step, the deferred order insert and
// total update, COMMIT), a guest checkout's no total update, and its effects
// are all committed; a redelivery's writes are skipped by the server.
func TestCheckoutRoundTrips(t *testing.T) {
	tdb := testdb.New(t, template)
	pool, rt := pgtrace.Pool(t, tdb.URL)
	h, proc, err := newHandler(pool, config{DatabaseURL: tdb.URL, WebhookSecret: testSecret}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	f := &fixture{db: tdb, q: ordersdb.New(tdb.Pool), url: srv.URL + "/webhooks/stripe"}

	code, out := f.deliver(t, checkout(t, "evt_rt_1", "cs_rt_1", "cus_rt", 250))
	wantAnswer(t, code, out, http.StatusOK, "processed")
	want := [][]string{{"begin", "InsertEvent", "InsertOrder", "AddCustomerSpend", "commit"}}
	if got := rt.Take(); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("checkout: round trips %q, want %q", got, want)
	}
	if got := f.total(t, "cus_rt"); got != 250 {
		t.Errorf("total spent = %d, want 250", got)
	}

	code, out = f.deliver(t, checkout(t, "evt_rt_2", "cs_rt_2", nil, 250))
	wantAnswer(t, code, out, http.StatusOK, "processed")
	want = [][]string{{"begin", "InsertEvent", "InsertOrder", "commit"}}
	if got := rt.Take(); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("guest checkout: round trips %q, want %q", got, want)
	}
	if n := f.count(t, "SELECT count(*) FROM orders WHERE checkout_session_id = 'cs_rt_2'"); n != 1 {
		t.Errorf("guest order rows = %d, want 1", n)
	}

	// The first checkout again: the same round trip, whose dedupe step
	// fails, so the server skips the writes and COMMIT; then the
	// ROLLBACK and the read of a lease-mode claim. (The processor forgets
	// the keys it saw done, as another process would not know them.)
	proc.ForgetRecentKeys()
	code, out = f.deliver(t, checkout(t, "evt_rt_1", "cs_rt_1", "cus_rt", 250))
	wantAnswer(t, code, out, http.StatusOK, "duplicate")
	want = [][]string{{"begin", "InsertEvent", "InsertOrder", "AddCustomerSpend", "commit"}, {"rollback"}, {"InFlightLease"}}
	if got := rt.Take(); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("duplicate checkout: round trips %q, want %q", got, want)
	}
	if got := f.total(t, "cus_rt"); got != 250 {
		t.Errorf("total spent after the redelivery = %d, want 250", got)
	}
}
