package amqpconsumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/amqpconsumer"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/internal/localaddr"
	"github.com/txhook/txhook/internal/rabbitnode"
	"github.com/txhook/txhook/internal/rabbittest"
	"github.com/txhook/txhook/internal/testdb"
)

func TestMain(m *testing.M) { rabbittest.Main(m) }

// waitBound bounds every wait of these tests: a message the consumer
// should apply in milliseconds fails the test in seconds.
const waitBound = 10 * time.Second

// bundle is one test's queue, database and publisher.
type bundle struct {
	url       string
	vhost     string // set by setup(t, true)
	node      *rabbitnode.Node
	db        *testdb.DB
	conn      *amqp.Connection
	pub       *amqp.Channel
	queue     string
	consumers []*amqpconsumer.Consumer
	started   []start // how each of consumers was made, to start it again
}

// start is what a consumer of the test's was made from.
type start struct {
	p   *txhook.Processor
	cfg amqpconsumer.Config
}

// setup returns t's bundle: a queue name of its own on the test broker's
// default virtual host (its queues are deleted when t ends), or, with
// ownVHost, a virtual host of its own (for tests that close its
// connections).
func setup(t *testing.T, ownVHost ...bool) *bundle {
	t.Helper()
	b := &bundle{db: testdb.New(t), node: rabbittest.Node(t), queue: rabbittest.Name(t)}
	b.url = b.node.URL
	if len(ownVHost) > 0 && ownVHost[0] {
		b.url, b.vhost = rabbittest.VHost(t)
	}
	if _, err := b.db.Pool.Exec(t.Context(), `CREATE TABLE effects (key text NOT NULL, type text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	b.dial(t)
	queue := b.queue
	t.Cleanup(func() {
		conn, err := amqp.Dial(b.url)
		if err != nil {
			t.Logf("delete queues: %v", err)
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Logf("delete queues: %v", err)
			return
		}
		for _, q := range append([]string{queue, queue + ".dead"}, amqpconsumer.RetryQueueNames(queue)...) {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				t.Logf("delete queue %s: %v", q, err)
				return
			}
		}
	})
	return b
}

// dial opens the publisher's connection and channel (in confirm mode).
func (b *bundle) dial(t *testing.T) {
	t.Helper()
	conn, err := amqp.Dial(b.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	b.conn = conn
	if b.pub, err = conn.Channel(); err != nil {
		t.Fatal(err)
	}
	if err := b.pub.Confirm(false); err != nil {
		t.Fatal(err)
	}
}

// effect is a handler that records its event in effects, in the event's
// transaction.
func effect(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
	_, err := tx.Exec(ctx, "INSERT INTO effects (key, type) VALUES ($1, $2)", ev.Key, ev.Type)
	return err
}

// processor returns a Processor on the test's database with rs.
func (b *bundle) processor(t *testing.T, rs *txhook.Routes) *txhook.Processor {
	t.Helper()
	p, err := txhook.NewProcessor(b.db.Pool, &txhook.Config{Routes: rs, StorePayload: true})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// consumer starts a consumer of the test's queue for source "orders" and
// stops it when the test ends.
func (b *bundle) consumer(t *testing.T, p *txhook.Processor, cfg amqpconsumer.Config) *amqpconsumer.Consumer {
	t.Helper()
	cfg.URL, cfg.Queue, cfg.Source = b.url, b.queue, "orders"
	if cfg.RetryBase == 0 {
		cfg.RetryBase, cfg.RetryMax = 20*time.Millisecond, 100*time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	c, err := amqpconsumer.New(p, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), waitBound)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	b.consumers = append(b.consumers, c)
	b.started = append(b.started, start{p, cfg})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitBound)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return c
}

// publish publishes a persistent message to the test's queue and waits for
// the broker's confirmation.
func (b *bundle) publish(t *testing.T, p amqp.Publishing) {
	t.Helper()
	b.publishTo(t, b.queue, p)
}

func (b *bundle) publishTo(t *testing.T, queue string, p amqp.Publishing) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitBound)
	defer cancel()
	p.DeliveryMode = amqp.Persistent
	dc, err := b.pub.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, p)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := dc.WaitContext(ctx); !ok || err != nil {
		t.Fatalf("publish not confirmed: %v %v", ok, err)
	}
}

// effects counts the effects of key.
func (b *bundle) effects(t *testing.T, key string) int {
	t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM effects WHERE key = $1", key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// status is key's status in the events table ("" when absent).
func (b *bundle) status(t *testing.T, key string) string {
	t.Helper()
	var s string
	err := b.db.Pool.QueryRow(t.Context(), "SELECT status FROM txhook_processed_events WHERE source = 'orders' AND event_key = $1", key).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// eventually polls cond until it holds, failing t after waitBound.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventuallyWithin(t, waitBound, what, cond)
}

// eventuallyWithin polls cond until it holds, failing t after bound.
func eventuallyWithin(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// queueDepth is the count of queue's messages ready to be delivered.
func (b *bundle) queueDepth(t *testing.T, queue string) int {
	t.Helper()
	ch, err := b.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

// settled checks that every message was acknowledged for good: it waits
// until the test's queue and its retry queues hold no ready message, stops
// the test's consumers (a message they held goes back to its queue, a copy
// they handed to a retry queue waits there) and checks that the queues are
// still empty. A copy on its way back is not a fault: the consumers are
// started again and the check repeated, a few times at most.
func (b *bundle) settled(t *testing.T) {
	t.Helper()
	queues := append([]string{b.queue}, amqpconsumer.RetryQueueNames(b.queue)...)
	ready := func() map[string]int {
		qs := map[string]int{}
		for _, q := range queues {
			if n := b.queueDepth(t, q); n != 0 {
				qs[q] = n
			}
		}
		return qs
	}
	for round := 1; ; round++ {
		eventually(t, "the queues are drained", func() bool { return len(ready()) == 0 })
		for _, c := range b.consumers {
			ctx, cancel := context.WithTimeout(t.Context(), waitBound)
			err := c.Stop(ctx)
			cancel()
			if err != nil {
				t.Fatalf("stop: %v", err)
			}
		}
		left := ready()
		if len(left) == 0 {
			return
		}
		if round == 3 {
			t.Fatalf("after the consumers stopped (%d times), queues hold messages %v, want none", round, left)
		}
		t.Logf("after the consumers stopped, queues hold messages %v: starting them again", left)
		started := b.started
		b.consumers, b.started = nil, nil
		for _, s := range started {
			b.consumer(t, s.p, s.cfg)
		}
	}
}

func TestMessageAppliedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rs := txhook.NewRoutes()
	rs.Transactional("orders", "order.created", effect)
	b.consumer(t, b.processor(t, rs), amqpconsumer.Config{})

	b.publish(t, amqp.Publishing{MessageId: "evt_1", Type: "order.created", Body: []byte(`{"n":1}`)})
	eventually(t, "evt_1 is applied", func() bool { return b.status(t, "evt_1") == "done" })
	// The publisher retries with the same id: a duplicate, acknowledged.
	b.publish(t, amqp.Publishing{MessageId: "evt_1", Type: "order.created", Body: []byte(`{"n":1}`)})
	b.settled(t)
	if n := b.effects(t, "evt_1"); n != 1 {
		t.Fatalf("evt_1 applied %d times, want once", n)
	}
}

func TestTypeFromRoutingKeySurvivesRetries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int32
	rs := txhook.NewRoutes()
	rs.Transactional("orders", "", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		if calls.Add(1) == 1 {
			return errors.New("first try fails")
		}
		return effect(ctx, tx, ev)
	})
	b.consumer(t, b.processor(t, rs), amqpconsumer.Config{TypeFromRoutingKey: true})
	exchange := b.queue + ".x"
	if err := b.pub.ExchangeDeclare(exchange, amqp.ExchangeTopic, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.pub.QueueBind(b.queue, "order.#", exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), waitBound)
	defer cancel()
	dc, err := b.pub.PublishWithDeferredConfirmWithContext(ctx, exchange, "order.created", true, false,
		amqp.Publishing{MessageId: "evt_rk", Type: "ignored.property", DeliveryMode: amqp.Persistent, Body: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := dc.WaitContext(ctx); !ok || err != nil {
		t.Fatalf("publish not confirmed: %v %v", ok, err)
	}
	eventually(t, "evt_rk is applied", func() bool { return b.status(t, "evt_rk") == "done" })
	var typ string
	if err := b.db.Pool.QueryRow(t.Context(), "SELECT type FROM effects WHERE key = 'evt_rk'").Scan(&typ); err != nil {
		t.Fatal(err)
	}
	// Delivered again from a retry queue, under the queue's name: the
	// routing key it was published with is kept.
	if typ != "order.created" || calls.Load() != 2 {
		t.Fatalf("type %q after %d calls, want the routing key order.created after 2", typ, calls.Load())
	}
	b.settled(t)
}

func TestHandlerErrorThenSuccess(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int32
	rs := txhook.NewRoutes()
	rs.Transactional("orders", "order.created", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		if err := effect(ctx, tx, ev); err != nil {
			return err
		}
		if calls.Add(1) <= 2 {
			return errors.New("not yet") // rolled back with the effect
		}
		return nil
	})
	b.consumer(t, b.processor(t, rs), amqpconsumer.Config{})
	b.publish(t, amqp.Publishing{MessageId: "evt_2", Type: "order.created", Body: []byte(`{}`)})
	eventually(t, "evt_2 is applied", func() bool { return b.status(t, "evt_2") == "done" })
	b.settled(t)
	if n, c := b.effects(t, "evt_2"), calls.Load(); n != 1 || c != 3 {
		t.Fatalf("evt_2: %d effects after %d handler calls, want 1 after 3", n, c)
	}
}

func TestPermanentErrorRecordedFailedAndAcked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int32
	rs := txhook.NewRoutes()
	rs.Transactional("orders", "order.created", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		calls.Add(1)
		return txhook.Permanent(errors.New("unknown account"))
	})
	b.consumer(t, b.processor(t, rs), amqpconsumer.Config{})
	b.publish(t, amqp.Publishing{MessageId: "evt_3", Type: "order.created", Body: []byte(`{}`)})
	eventually(t, "evt_3 is recorded failed", func() bool { return b.status(t, "evt_3") == "failed" })
	b.settled(t)
	if c := calls.Load(); c != 1 {
		t.Fatalf("handler ran %d times, want once: a permanent error is not retried", c)
	}
}

// The last attempt (MaxAttempts) records the handler's error as a dead
// letter before the ack; an operator's replay then applies it.
func TestLastAttemptRecordedThenReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var fixed atomic.Bool
	var calls atomic.Int32
	h := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		calls.Add(1)
		if !fixed.Load() {
			return errors.New("bug in the handler")
		}
		return effect(ctx, tx, ev)
	}
	rs := txhook.NewRoutes()
	rs.Transactional("orders", "order.created", h)
	p := b.processor(t, rs)
	b.consumer(t, p, amqpconsumer.Config{MaxAttempts: 3})
	b.publish(t, amqp.Publishing{MessageId: "evt_4", Type: "order.created", Body: []byte(`{"v":4}`)})
	eventually(t, "evt_4 is recorded failed", func() bool { return b.status(t, "evt_4") == "failed" })
	b.settled(t)
	if c := calls.Load(); c != 3 {
		t.Fatalf("handler ran %d times, want MaxAttempts (3)", c)
	}
	fixed.Store(true)
	res, err := p.Replay(t.Context(), "orders", "evt_4")
	if err != nil || res.Outcome != txhook.OutcomeProcessed {
		t.Fatalf("replay: %v %v", res.Outcome, err)
	}
	if n := b.effects(t, "evt_4"); n != 1 {
		t.Fatalf("evt_4 applied %d times after its replay, want once", n)
	}
}

// The quorum queue's own last delivery (x-delivery-count reaching the
// delivery limit, after deliveries that ended unanswered) is a last
// attempt too: the handler's error is recorded before the ack.
func TestBrokersLastDeliveryRecordedFailed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const limit = 2
	rs := txhook.NewRoutes()
	var calls atomic.Int32
	rs.Transactional("orders", "order.created", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		calls.Add(1)
		return errors.New("always fails")
	})
	p := b.processor(t, rs)
	// The consumer declares the queue; stopped at once, it leaves the
	// message to a consumer that gives it back unanswered, limit times.
	c := b.consumer(t, p, amqpconsumer.Config{DeliveryLimit: limit, MaxAttempts: 100, Prefetch: 1})
	ctx, cancel := context.WithTimeout(t.Context(), waitBound)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	b.publish(t, amqp.Publishing{MessageId: "evt_5", Type: "order.created", Body: []byte(`{}`)})
	for i := range limit {
		d, ok, err := b.pub.Get(b.queue, false)
		if err != nil || !ok {
			t.Fatalf("get %d: %v %v", i, ok, err)
		}
		if err := d.Nack(false, true); err != nil {
			t.Fatal(err)
		}
	}
	b.consumer(t, p, amqpconsumer.Config{DeliveryLimit: limit, MaxAttempts: 100, Prefetch: 1})
	eventually(t, "evt_5 is recorded failed", func() bool { return b.status(t, "evt_5") == "failed" })
	b.settled(t)
	if n := calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want once: the broker's last delivery is the last attempt", n)
	}
}

// A message without a usable key goes to the dead-letter queue, never
// applied, with the reason in a header.
func TestMessageWithoutKeyDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rs := txhook.NewRoutes()
	rs.Transactional("orders", "", effect)
	b.consumer(t, b.processor(t, rs), amqpconsumer.Config{})
	b.publish(t, amqp.Publishing{Type: "order.created", Body: []byte(`no id`)})
	b.publish(t, amqp.Publishing{MessageId: "bad\x00id", Type: "order.created", Body: []byte(`nul`)})
	eventually(t, "both are dead-lettered", func() bool { return b.queueDepth(t, b.queue+".dead") == 2 })
	b.settled(t)
	for range 2 {
		d, ok, err := b.pub.Get(b.queue+".dead", true)
		if err != nil || !ok {
			t.Fatalf("get dead letter: %v %v", ok, err)
		}
		if why, _ := d.Headers["x-txhook-error"].(string); why == "" {
			t.Errorf("dead letter %q carries no x-txhook-error header", d.Body)
		}
	}
	var n int
	if err := b.db.Pool.QueryRow(t.Context(), "SELECT (SELECT count(*) FROM effects) + (SELECT count(*) FROM txhook_processed_events)").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d rows written for messages without a usable key, want none", n)
	}
}

// A retry or dead-letter queue deleted under a running consumer loses no
// message: the broker returns the copy sent to it (it would confirm and
// drop it otherwise), the message is given back, and the queue is declared
// again before the next copy.
func TestCopyToADeletedQueueIsNotLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tries := map[string]int{}
	var mu sync.Mutex
	rs := txhook.NewRoutes()
	rs.Transactional("orders", "", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		mu.Lock()
		tries[ev.Key]++
		n := tries[ev.Key]
		mu.Unlock()
		if n == 1 {
			return errors.New("first try fails")
		}
		return effect(ctx, tx, ev)
	})
	b.consumer(t, b.processor(t, rs), amqpconsumer.Config{})
	// evt_20's retry and a message without a key declare the retry queue
	// and use the dead-letter queue.
	b.publish(t, amqp.Publishing{MessageId: "evt_20", Type: "x", Body: []byte(`{}`)})
	b.publish(t, amqp.Publishing{Type: "x", Body: []byte(`no id`)})
	eventually(t, "evt_20 is applied and the message without a key dead-lettered", func() bool {
		return b.status(t, "evt_20") == "done" && b.queueDepth(t, b.queue+".dead") == 1
	})
	for _, q := range append([]string{b.queue + ".dead"}, amqpconsumer.RetryQueueNames(b.queue)...) {
		if _, err := b.pub.QueueDelete(q, false, false, false); err != nil {
			t.Fatalf("delete queue %s: %v", q, err)
		}
	}
	b.publish(t, amqp.Publishing{MessageId: "evt_21", Type: "x", Body: []byte(`{}`)})
	b.publish(t, amqp.Publishing{Type: "x", Body: []byte(`no id either`)})
	eventually(t, "evt_21 is applied and the message without a key dead-lettered", func() bool {
		return b.status(t, "evt_21") == "done" && b.queueDepth(t, b.queue+".dead") == 1
	})
	b.settled(t)
	if n := b.effects(t, "evt_21"); n != 1 {
		t.Fatalf("evt_21 applied %d times, want once", n)
	}
}

// The connection is closed from the server's side while a message is
// being applied: its commit happens, its ack cannot reach the broker, the
// broker delivers it again on the consumer's new connection, and that
// delivery is answered duplicate. Then the consumer goes on.
func TestConnectionClosedBeforeTheAck(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	var calls, duplicates atomic.Int32
	rs := txhook.NewRoutes()
	rs.Transactional("orders", "order.created", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		if ev.Key == "evt_6" && calls.Add(1) == 1 {
			entered <- struct{}{}
			<-release
		}
		return effect(ctx, tx, ev)
	})
	b.consumer(t, b.processor(t, rs), amqpconsumer.Config{Observer: handler.ObserverFunc(func(_ context.Context, r handler.Report) {
		if r.Key == "evt_6" && r.Answer == handler.AnswerDuplicate {
			duplicates.Add(1)
		}
	})})
	b.publish(t, amqp.Publishing{MessageId: "evt_6", Type: "order.created", Body: []byte(`{}`)})
	select {
	case <-entered:
	case <-time.After(waitBound):
		t.Fatal("evt_6 never reached its handler")
	}
	if err := b.node.CloseConnections(t.Context(), b.vhost); err != nil {
		t.Fatal(err)
	}
	close(release)
	eventually(t, "evt_6 is delivered again and answered duplicate", func() bool { return duplicates.Load() >= 1 })
	b.dial(t) // the publisher's connection was closed too
	b.publish(t, amqp.Publishing{MessageId: "evt_7", Type: "order.created", Body: []byte(`{}`)})
	eventually(t, "evt_7 is applied after the reconnection", func() bool { return b.status(t, "evt_7") == "done" })
	b.settled(t)
	if n := b.effects(t, "evt_6"); n != 1 {
		t.Fatalf("evt_6 applied %d times, want once", n)
	}
}

// Stop waits for the messages in flight: the one being applied commits and
// is acknowledged before Stop returns.
func TestStopDrainsMessagesInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	entered := make(chan struct{}, 1)
	rs := txhook.NewRoutes()
	rs.Transactional("orders", "order.created", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		entered <- struct{}{}
		time.Sleep(300 * time.Millisecond)
		return effect(ctx, tx, ev)
	})
	c := b.consumer(t, b.processor(t, rs), amqpconsumer.Config{})
	b.publish(t, amqp.Publishing{MessageId: "evt_8", Type: "order.created", Body: []byte(`{}`)})
	<-entered
	ctx, cancel := context.WithTimeout(t.Context(), waitBound)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if s := b.status(t, "evt_8"); s != "done" {
		t.Fatalf("after Stop, evt_8 is %q, want done", s)
	}
	b.settled(t)
}

// A database that cannot be used on the last attempt records nothing and
// gives nothing up: the message stays in the retry queues, and a consumer
// with a working database applies it.
func TestDatabaseDownOnTheLastAttemptKeepsTheMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rs := txhook.NewRoutes()
	rs.Transactional("orders", "order.created", effect)
	b.throughOutage(t, rs, "evt_9", 4) // several deliveries past the last attempt
	if s := b.status(t, "evt_9"); s != "" {
		t.Fatalf("evt_9 is %q with the database down, want nothing recorded", s)
	}
	b.consumer(t, b.processor(t, rs), amqpconsumer.Config{MaxAttempts: 2})
	eventually(t, "evt_9 is applied once the database is back", func() bool { return b.status(t, "evt_9") == "done" })
	b.settled(t)
}

// Deliveries that find the database unusable spend none of a message's
// attempts: once the database is back, a message that waited out an
// outage longer than MaxAttempts deliveries still has its retries for a
// handler's error, and is applied rather than recorded failed.
func TestOutageSpendsNoAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rs := txhook.NewRoutes()
	var calls atomic.Int32
	rs.Transactional("orders", "order.created", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		if calls.Add(1) == 1 {
			return errors.New("the first try after the outage fails")
		}
		return effect(ctx, tx, ev)
	})
	b.throughOutage(t, rs, "evt_14", 3) // more deliveries in the outage than MaxAttempts
	b.consumer(t, b.processor(t, rs), amqpconsumer.Config{MaxAttempts: 2})
	eventually(t, "evt_14 is settled once the database is back", func() bool { return b.status(t, "evt_14") != "" })
	b.settled(t)
	if s, n := b.status(t, "evt_14"), calls.Load(); s != "done" || n != 2 {
		t.Fatalf("evt_14 is %q after %d handler calls, want done after 2 (an error, then a retry)", s, n)
	}
}

// throughOutage publishes an order.created message keyed key and lets a
// consumer (MaxAttempts 2) whose processor has rs but no reachable database
// deliver it at least deliveries times, then stops that consumer.
func (b *bundle) throughOutage(t *testing.T, rs *txhook.Routes, key string, deliveries int32) {
	t.Helper()
	down, err := txhook.NewProcessor(unreachablePool(t), &txhook.Config{Routes: rs})
	if err != nil {
		t.Fatal(err)
	}
	var seen atomic.Int32
	c := b.consumer(t, down, amqpconsumer.Config{MaxAttempts: 2, Logger: slog.New(countingHandler{&seen})})
	b.publish(t, amqp.Publishing{MessageId: key, Type: "order.created", Body: []byte(`{}`)})
	eventually(t, fmt.Sprintf("%d deliveries of %s with the database down", deliveries, key), func() bool { return seen.Load() >= deliveries })
	ctx, cancel := context.WithTimeout(t.Context(), waitBound)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// countingHandler counts the consumer's delivery records.
type countingHandler struct{ n *atomic.Int32 }

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "txhook: delivery" {
		h.n.Add(1)
	}
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }

// A lease-mode route applies its event once through the consumer too.
func TestLeaseRoute(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var external atomic.Int32
	rs := txhook.NewRoutes()
	rs.Lease("orders", "order.shipped", txhook.LeaseHandler{
		Lease: 5 * time.Second,
		Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
			external.Add(1)
			return func(ctx context.Context, tx pgx.Tx) error { return effect(ctx, tx, ev) }, nil
		},
	})
	b.consumer(t, b.processor(t, rs), amqpconsumer.Config{})
	b.publish(t, amqp.Publishing{MessageId: "evt_10", Type: "order.shipped", Body: []byte(`{}`)})
	b.publish(t, amqp.Publishing{MessageId: "evt_10", Type: "order.shipped", Body: []byte(`{}`)})
	eventually(t, "evt_10 is applied", func() bool { return b.status(t, "evt_10") == "done" })
	b.settled(t)
	if n, e := b.effects(t, "evt_10"), external.Load(); n != 1 || e != 1 {
		t.Fatalf("evt_10: %d effects, %d external calls; want 1 and 1", n, e)
	}
}

// Declaring is idempotent on a queue that exists with the consumer's
// arguments.
func TestQueueDeclaredTwice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rs := txhook.NewRoutes()
	rs.Transactional("orders", "", effect)
	p := b.processor(t, rs)
	b.consumer(t, p, amqpconsumer.Config{})
	b.consumer(t, p, amqpconsumer.Config{}) // the queues exist now, with the same arguments
	b.publish(t, amqp.Publishing{MessageId: "evt_11", Type: "x", Body: []byte(`{}`)})
	eventually(t, "evt_11 is applied", func() bool { return b.status(t, "evt_11") == "done" })
	b.settled(t)
}

// A queue declared by someone else with other arguments (a classic queue)
// is used as it is.
func TestClassicQueueUsedAsItIs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pub.QueueDeclare(b.queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	rs := txhook.NewRoutes()
	rs.Transactional("orders", "", effect)
	var calls atomic.Int32
	rs.Transactional("orders", "flaky", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		if calls.Add(1) == 1 {
			return errors.New("first try fails")
		}
		return effect(ctx, tx, ev)
	})
	b.consumer(t, b.processor(t, rs), amqpconsumer.Config{})
	b.publish(t, amqp.Publishing{MessageId: "evt_12", Type: "x", Body: []byte(`{}`)})
	b.publish(t, amqp.Publishing{MessageId: "evt_13", Type: "flaky", Body: []byte(`{}`)})
	eventually(t, "evt_12 and evt_13 are applied from the classic queue", func() bool {
		return b.status(t, "evt_12") == "done" && b.status(t, "evt_13") == "done"
	})
	b.settled(t)
}

func TestNewRefusesASourceWithoutRoutes(t *testing.T) {
	t.Parallel()
	rs := txhook.NewRoutes()
	rs.Transactional("stripe", "", effect)
	p, err := txhook.NewProcessor(unreachablePool(t), &txhook.Config{Routes: rs})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := amqpconsumer.New(p, &amqpconsumer.Config{URL: "amqp://127.0.0.1/", Queue: "q", Source: "orders"}); err == nil {
		t.Fatal("New accepted a source without a route")
	}
	if _, err := amqpconsumer.New(p, &amqpconsumer.Config{URL: "amqp://127.0.0.1/", Queue: "q", Source: "stripe"}); err != nil {
		t.Fatalf("New: %v", err)
	}
}

// unreachablePool is a pool on a port where no server listens: every
// delivery through it finds the database unavailable.
func unreachablePool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	addr, err := localaddr.Free()
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(t.Context(), "postgres://nobody@"+addr+"/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Logf("%s", p); return len(p), nil }

// The broker restarts mid-stream (a node of the test's own: the machine's
// is shared): the consumer reconnects and resumes, and every message is
// applied once, none left in the queues.
func TestBrokerRestartedMidStream(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if !rabbitnode.Available() {
		rabbittest.NoBroker(t, errors.New("rabbitmq-server is not installed"))
	}
	node, err := rabbitnode.Start(ctx)
	if err != nil {
		rabbittest.NoBroker(t, err)
	}
	t.Cleanup(node.Stop)
	b := &bundle{db: testdb.New(t), node: node, url: node.URL, queue: "restarted"}
	if _, err := b.db.Pool.Exec(t.Context(), `CREATE TABLE effects (key text NOT NULL, type text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	rs := txhook.NewRoutes()
	rs.Transactional("orders", "order.created", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		time.Sleep(5 * time.Millisecond) // a stream that takes a while
		return effect(ctx, tx, ev)
	})
	b.consumer(t, b.processor(t, rs), amqpconsumer.Config{Prefetch: 4})
	const n = 200
	for i := range n {
		if i == n/4 {
			eventually(t, "the first messages are applied", func() bool {
				return b.status(t, fmt.Sprintf("evt_%d", n/8)) == "done"
			})
			t0 := time.Now()
			if err := node.Restart(ctx); err != nil {
				t.Fatal(err)
			}
			t.Logf("broker restarted in %s", time.Since(t0).Round(100*time.Millisecond))
		}
		for { // a publisher dials again after the restart and publishes again what was not confirmed
			if b.pub == nil || b.pub.IsClosed() {
				if err := b.redial(); err != nil {
					time.Sleep(100 * time.Millisecond)
					continue
				}
			}
			if b.tryPublish(ctx, amqp.Publishing{MessageId: fmt.Sprintf("evt_%d", i), Type: "order.created", Body: []byte(`{}`)}) == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// The consumer dials again with backoff (at most 5s between tries)
	// while the node restarts, and the node's start takes seconds.
	eventuallyWithin(t, 30*time.Second, "every message is applied", func() bool {
		var done int
		if err := b.db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM txhook_processed_events WHERE status = 'done'").Scan(&done); err != nil {
			t.Fatal(err)
		}
		return done == n
	})
	b.settled(t)
	var rows, keys int
	if err := b.db.Pool.QueryRow(t.Context(), "SELECT count(*), count(DISTINCT key) FROM effects").Scan(&rows, &keys); err != nil {
		t.Fatal(err)
	}
	if rows != n || keys != n {
		t.Fatalf("%d effects of %d keys, want %d, each once", rows, keys, n)
	}
}

// redial opens the publisher's connection again.
func (b *bundle) redial() error {
	conn, err := amqp.Dial(b.url)
	if err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		conn.Close()
		return err
	}
	b.conn, b.pub = conn, ch
	return nil
}

// tryPublish publishes p to the test's queue and waits for its
// confirmation.
func (b *bundle) tryPublish(ctx context.Context, p amqp.Publishing) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	p.DeliveryMode = amqp.Persistent
	dc, err := b.pub.PublishWithDeferredConfirmWithContext(ctx, "", b.queue, true, false, p)
	if err != nil {
		return err
	}
	if ok, err := dc.WaitContext(ctx); !ok || err != nil {
		return fmt.Errorf("not confirmed: %v", err)
	}
	return nil
}
