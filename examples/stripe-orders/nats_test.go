package main

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txhook/txhook/examples/stripe-orders/ordersdb"
	"github.com/txhook/txhook/internal/natsserver"
	"github.com/txhook/txhook/internal/testdb"
)

// natsFixture is the example with NATS_URL set, on a NATS server of the
// test's own (the stream's name is the example's contract, ORDERS), and a
// publisher's connection to it.
type natsFixture struct {
	*fixture
	js   jetstream.JetStream
	cons jetstream.Consumer
}

func setupNATS(t *testing.T) *natsFixture {
	t.Helper()
	srv := natsserver.Own(t)
	tdb := testdb.New(t, template)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	h, proc, err := newHandler(tdb.Pool, config{DatabaseURL: tdb.URL, WebhookSecret: testSecret}, log)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	stop, err := startNATS(t.Context(), srv.URL, proc, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	nc, err := nats.Connect(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(t.Context(), natsStream, natsConsumer)
	if err != nil {
		t.Fatal(err)
	}
	return &natsFixture{fixture: &fixture{db: tdb, q: ordersdb.New(tdb.Pool), url: hs.URL + "/webhooks/stripe"}, js: js, cons: cons}
}

// publish publishes a Stripe event's body as the contract says: on
// orders.<type>, its id in Nats-Msg-Id (none when id is "").
func (f *natsFixture) publish(t *testing.T, typ, id string, body []byte) {
	t.Helper()
	m := &nats.Msg{Subject: "orders." + typ, Data: body, Header: nats.Header{}}
	if id != "" {
		m.Header.Set("Nats-Msg-Id", id)
	}
	if _, err := f.js.PublishMsg(t.Context(), m); err != nil {
		t.Fatalf("publish %s: %v", id, err)
	}
}

// settled waits until the consumer has acknowledged every message.
func (f *natsFixture) settled(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := f.cons.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending == 0 && info.NumPending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer: %d unacknowledged, %d pending after 10s", info.NumAckPending, info.NumPending)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// An event published to ORDERS is applied through the same routes and
// tables as the webhooks: delivered both ways, by NATS first or by HTTP
// first, it is applied once. A message without Nats-Msg-Id goes to
// ORDERS_DEAD, never applied.
func TestNATSAndHTTPApplyAnEventOnce(t *testing.T) {
	t.Parallel()
	f := setupNATS(t)

	first := checkout(t, "evt_n1", "cs_n1", "cus_n", 4200)
	f.publish(t, "checkout.session.completed", "evt_n1", first)
	f.settled(t)
	if got := f.total(t, "cus_n"); got != 4200 {
		t.Fatalf("total after the NATS message = %d, want 4200", got)
	}
	s, o := f.deliver(t, first)
	wantAnswer(t, s, o, 200, "duplicate")

	second := checkout(t, "evt_n2", "cs_n2", "cus_n", 1800)
	s, o = f.deliver(t, second)
	wantAnswer(t, s, o, 200, "processed")
	f.publish(t, "checkout.session.completed", "evt_n2", second)
	f.publish(t, "invoice.created", "evt_n3", invoiceEvent(t, "evt_n3", "invoice.created", "in_n3", 700))
	f.publish(t, "checkout.session.completed", "", checkout(t, "evt_n4", "cs_n4", "cus_n", 100))
	f.settled(t)
	if got := f.total(t, "cus_n"); got != 6000 {
		t.Fatalf("total = %d, want 6000: each checkout once", got)
	}
	if n := f.count(t, "SELECT count(*) FROM invoices WHERE id = 'in_n3'"); n != 1 {
		t.Errorf("invoice from orders.invoice.created: %d rows, want 1 (type from the subject)", n)
	}
	if n := f.count(t, "SELECT count(*) FROM txhook_processed_events WHERE source = 'stripe'"); n != 3 {
		t.Errorf("%d stripe events recorded, want 3 (evt_n1, evt_n2, evt_n3; not the keyless one)", n)
	}
	dead, err := f.js.Stream(t.Context(), natsDeadStream)
	if err != nil {
		t.Fatal(err)
	}
	if n := dead.CachedInfo().State.Msgs; n != 1 {
		t.Errorf("%s holds %d messages, want 1 (the message without Nats-Msg-Id)", natsDeadStream, n)
	}
}
