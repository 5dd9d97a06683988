package main

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txhook/txhook/internal/rabbittest"
)

// The queue orders and the endpoint apply through the same routes and
// tables under one source: an event published to the queue (its id in
// message-id, its type in type) and then delivered by HTTP, or the other way
// round, is applied once; a publisher's retry is a duplicate.
func TestQueueAndEndpointApplyOnce(t *testing.T) {
	t.Parallel()
	f := setup(t, "")
	url, _ := rabbittest.VHost(t) // the queue's name is the contract's: a virtual host of the test's own
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c, err := startConsumer(ctx, f.proc, url, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Error(err)
		}
	})
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	publish := func(id, typ string, body []byte) {
		t.Helper()
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", ordersQueue, true, false, amqp.Publishing{
			MessageId: id, Type: typ, ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: body,
		})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("publish %s not confirmed: %v %v", id, ok, err)
		}
	}
	waitDone := func(id string) {
		t.Helper()
		for f.count(t, "SELECT count(*) FROM txhook_processed_events WHERE source = 'stripe' AND event_key = $1 AND status = 'done'", id) == 0 {
			if ctx.Err() != nil {
				t.Fatalf("%s never applied from the queue", id)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// From the queue first, then by HTTP.
	first := checkout(t, "evt_q1", "cs_q1", "cus_q", 1000)
	publish("evt_q1", "checkout.session.completed", first)
	waitDone("evt_q1")
	s, o := f.deliver(t, first)
	wantAnswer(t, s, o, 200, "duplicate")

	// By HTTP first, then from the queue, twice (a publisher's retry).
	second := checkout(t, "evt_q2", "cs_q2", "cus_q", 500)
	s, o = f.deliver(t, second)
	wantAnswer(t, s, o, 200, "processed")
	publish("evt_q2", "checkout.session.completed", second)
	publish("evt_q2", "checkout.session.completed", second)

	// A third event shows the queue drained past them.
	publish("evt_q3", "checkout.session.completed", checkout(t, "evt_q3", "cs_q3", "cus_q", 1))
	waitDone("evt_q3")
	q, err := ch.QueueDeclarePassive(ordersQueue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.total(t, "cus_q"); got != 1501 || q.Messages != 0 {
		t.Fatalf("customer total %d with %d messages left, want 1501 (each event once) and none", got, q.Messages)
	}
}
