package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/natsconsumer"
)

// The JetStream side of the example (NATS_URL). Publishers rely on the
// stream, its subjects and the headers: a Stripe event's JSON body on
// orders.<event type> with the event id in Nats-Msg-Id.
const (
	natsStream        = "ORDERS"
	natsSubjects      = "orders.>"
	natsTypePrefix    = "orders."
	natsConsumer      = "stripe-orders"
	natsDeadStream    = "ORDERS_DEAD"
	natsDeadSubject   = "orders-dead"
	natsAckWait       = 30 * time.Second
	natsMaxDeliver    = 10
	natsConnectWait   = 30 * time.Second
	natsStopTimeout   = 10 * time.Second
	natsReconnectWait = 250 * time.Millisecond
)

// startNATS connects to NATS at url, creates the stream ORDERS (and
// ORDERS_DEAD, for messages that can never be applied) and the durable
// consumer stripe-orders when they are missing, and starts applying the
// messages through proc's routes, as source "stripe": an event delivered by
// HTTP and by NATS is one event. The function it returns stops the consumer,
// waiting for the messages in flight, and closes the connection.
func startNATS(ctx context.Context, url string, proc *txhook.Processor, log *slog.Logger) (stop func(), err error) {
	nc, err := nats.Connect(url, nats.Name("stripe-orders"), nats.MaxReconnects(-1), nats.ReconnectWait(natsReconnectWait),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { log.Warn("nats disconnected", "error", err) }),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("nats reconnected", "url", nc.ConnectedUrl()) }))
	if err != nil {
		return nil, fmt.Errorf("connect to NATS (NATS_URL): %w", err)
	}
	c, err := newNATSConsumer(ctx, nc, proc, log)
	if err != nil {
		nc.Close()
		return nil, err
	}
	log.Info("consuming", "stream", natsStream, "subjects", natsSubjects, "consumer", natsConsumer)
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), natsStopTimeout)
		defer cancel()
		if err := c.Stop(sctx); err != nil {
			log.Error("stop the NATS consumer", "error", err)
		}
		nc.Close()
	}, nil
}

// newNATSConsumer sets up the streams and the consumer on nc and starts a
// natsconsumer.Consumer on them, until ctx ends.
func newNATSConsumer(ctx context.Context, nc *nats.Conn, proc *txhook.Processor, log *slog.Logger) (*natsconsumer.Consumer, error) {
	runCtx := ctx
	ctx, cancel := context.WithTimeout(ctx, natsConnectWait)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	for _, s := range []jetstream.StreamConfig{
		{Name: natsStream, Subjects: []string{natsSubjects}, Storage: jetstream.FileStorage},
		{Name: natsDeadStream, Subjects: []string{natsDeadSubject}, Storage: jetstream.FileStorage},
	} {
		if _, err := js.Stream(ctx, s.Name); errors.Is(err, jetstream.ErrStreamNotFound) {
			_, err = js.CreateStream(ctx, s)
			if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) { // another instance made it
				return nil, fmt.Errorf("create stream %s: %w", s.Name, err)
			}
		} else if err != nil {
			return nil, fmt.Errorf("look up stream %s: %w", s.Name, err)
		}
	}
	if _, err := js.Consumer(ctx, natsStream, natsConsumer); errors.Is(err, jetstream.ErrConsumerNotFound) {
		_, err = js.CreateConsumer(ctx, natsStream, jetstream.ConsumerConfig{
			Durable:    natsConsumer,
			AckPolicy:  jetstream.AckExplicitPolicy,
			AckWait:    natsAckWait,
			MaxDeliver: natsMaxDeliver,
		})
		if err != nil && !errors.Is(err, jetstream.ErrConsumerExists) {
			return nil, fmt.Errorf("create consumer %s: %w", natsConsumer, err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("look up consumer %s: %w", natsConsumer, err)
	}
	c, err := natsconsumer.New(proc, js, &natsconsumer.Config{
		Stream:            natsStream,
		Consumer:          natsConsumer,
		Source:            source,
		TypeSubjectPrefix: natsTypePrefix,
		DeadLetterSubject: natsDeadSubject,
		Logger:            log,
	})
	if err != nil {
		return nil, fmt.Errorf("new NATS consumer: %w", err)
	}
	if err := c.Start(runCtx); err != nil {
		return nil, fmt.Errorf("start NATS consumer: %w", err)
	}
	return c, nil
}
