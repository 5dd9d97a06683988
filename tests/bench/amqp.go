package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/amqpconsumer"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/internal/rabbitnode"
)

// RabbitMQ rows of the report. Each worker publishes a checkout event (its
// id in message-id) to a queue of the row's own and waits until the
// consumer has applied it and acknowledged it: the latency is from the
// publish to the ack after COMMIT, and the concurrency is the messages in
// flight (the consumer's prefetch is set to it). The txhook row is
// amqpconsumer with the example's handler; the hand-written row is the
// usual consumer on the same client: the dedupe insert ON CONFLICT DO
// NOTHING and the writes in one transaction (baselineApply), then the ack.
const (
	scenAMQP         = "txhook AMQP consumer"
	scenAMQPBaseline = "hand-written AMQP consumer"
)

// amqpTarget is the txhook row's target against the hand-written one.
const amqpTarget = 1.0

// amqpBench holds what the RabbitMQ rows share at one concurrency.
type amqpBench struct {
	conn     *amqp.Connection
	pubs     []*amqp.Channel // one per worker
	consumer *amqpconsumer.Consumer
	baseline *baselineConsumer
	queues   []string
	pool     *pgxpool.Pool
	waiters
}

// amqpBroker is the machine's RabbitMQ when it answers, else a node the
// bench starts (stopped by the returned function).
func amqpBroker(ctx context.Context) (*rabbitnode.Node, func(), error) {
	if c, err := net.DialTimeout("tcp", rabbitnode.Shared.Addr, time.Second); err == nil {
		c.Close()
		return rabbitnode.Shared, func() {}, nil
	}
	n, err := rabbitnode.Start(ctx)
	if err != nil {
		return nil, nil, err
	}
	return n, n.Stop, nil
}

func newAMQPBench(ctx context.Context, node *rabbitnode.Node, dbURL, tag string, c int) (*amqpBench, error) {
	b := &amqpBench{}
	ok := false
	defer func() {
		if !ok {
			b.stop()
		}
	}()
	var err error
	if b.pool, _, err = openPool(ctx, dbURL, c); err != nil {
		return nil, err
	}
	if b.conn, err = amqp.Dial(node.URL); err != nil {
		return nil, fmt.Errorf("dial broker: %w", err)
	}
	for range c {
		ch, err := b.conn.Channel()
		if err != nil {
			return nil, err
		}
		b.pubs = append(b.pubs, ch)
	}
	q := "txhook-bench-" + tag + "-" + strconv.Itoa(c)
	rs := txhook.NewRoutes()
	rs.Transactional("stripe", "checkout.session.completed", libraryHandler)
	proc, err := txhook.NewProcessor(b.pool, &txhook.Config{StorePayload: true, DedupeWithFirstStatement: true, Routes: rs})
	if err != nil {
		return nil, err
	}
	b.consumer, err = amqpconsumer.New(proc, &amqpconsumer.Config{
		URL: node.URL, Queue: q, Source: "stripe", Prefetch: c,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Observer: handler.ObserverFunc(func(_ context.Context, r handler.Report) {
			if r.Answer == handler.AnswerProcessed {
				b.signal(r.Key)
			}
		}),
	})
	if err != nil {
		return nil, err
	}
	b.queues = append(b.queues, q, q+".dead")
	if err := b.consumer.Start(ctx); err != nil {
		return nil, err
	}
	b.baseline, err = startBaselineConsumer(node.URL, b.pool, q+"-baseline", c, b.signal)
	if err != nil {
		return nil, err
	}
	b.queues = append(b.queues, q+"-baseline")
	ok = true
	return b, nil
}

func (b *amqpBench) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if b.consumer != nil {
		_ = b.consumer.Stop(ctx)
	}
	if b.baseline != nil {
		b.baseline.stop()
	}
	if b.conn != nil {
		if ch, err := b.conn.Channel(); err == nil {
			for _, q := range b.queues {
				_, _ = ch.QueueDelete(q, false, false, false)
			}
		}
		b.conn.Close()
	}
	if b.pool != nil {
		b.pool.Close()
	}
}

// publishAndWait publishes worker w's event to queue and waits until it
// was applied and acknowledged.
func (b *amqpBench) publishAndWait(ctx context.Context, w int, queue, key string, body []byte) error {
	done := b.wait(key)
	err := b.pubs[w].PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{
		MessageId: key, Type: "checkout.session.completed", ContentType: "application/json",
		DeliveryMode: amqp.Persistent, Body: body,
	})
	if err != nil {
		b.signal(key)
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return await(wctx, done)
}

// amqpScenarios returns the RabbitMQ rows at concurrency c.
func amqpScenarios(o options, c int, b *amqpBench) []scenario {
	row := func(name, prefix, queue string) scenario {
		src := eventSource{prefix: o.tag + prefix + strconv.Itoa(c), customers: 1000}
		next := make([]int, c)
		return scenario{name: name, measure: func(ctx context.Context) (sample, error) {
			return measure(ctx, c, o.warmup, o.duration, nil, func(ctx context.Context, w int) error {
				key, body := src.next(w, next[w])
				next[w]++
				return b.publishAndWait(ctx, w, queue, key, body)
			}), nil
		}}
	}
	return []scenario{
		row(scenAMQP, "amqp", b.queues[0]),
		row(scenAMQPBaseline, "amqpbase", b.baseline.queue),
	}
}

// baselineConsumer is the hand-written consumer: each delivery applied in
// a goroutine (the channel's prefetch bounds them) by baselineApply, then
// acknowledged; an error requeues it. Like amqpconsumer, and like a
// consumer in a process of its own, it dials a connection of its own:
// sharing the publishers' connection made its latency at c=1 shorter than
// a separate consumer's can be, which is not what the row compares.
type baselineConsumer struct {
	conn  *amqp.Connection
	ch    *amqp.Channel
	queue string
	done  chan struct{}
}

func startBaselineConsumer(url string, pool *pgxpool.Pool, queue string, prefetch int, applied func(key string)) (_ *baselineConsumer, err error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, fmt.Errorf("dial broker: %w", err)
	}
	defer func() {
		if err != nil {
			conn.Close()
		}
	}()
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		return nil, fmt.Errorf("declare %s: %w", queue, err)
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return nil, err
	}
	ds, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		return nil, err
	}
	bc := &baselineConsumer{conn: conn, ch: ch, queue: queue, done: make(chan struct{})}
	go func() {
		defer close(bc.done)
		var wg sync.WaitGroup
		for d := range ds {
			wg.Go(func() {
				ctx := context.Background()
				ev, err := decodeCheckout(d.Body)
				if err == nil {
					err = baselineApply(ctx, pool, ev, d.Body)
				}
				if err != nil && !errors.Is(err, errBadEvent) {
					_ = d.Nack(false, true)
					return
				}
				if d.Ack(false) == nil {
					applied(d.MessageId)
				}
			})
		}
		wg.Wait()
	}()
	return bc, nil
}

func (bc *baselineConsumer) stop() {
	_ = bc.ch.Close()
	<-bc.done
	_ = bc.conn.Close()
}
