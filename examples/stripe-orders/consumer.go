package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/amqpconsumer"
)

// ordersQueue is the RabbitMQ queue the example consumes with AMQP_URL set.
// Publishers rely on it: each message a Stripe event JSON body, its event
// id (evt_...) in the message-id property and its type in the type
// property. An event that arrives both by HTTP and from the queue is
// applied once: both are source "stripe".
const ordersQueue = "orders"

// startConsumer starts the consumer of the orders queue on the broker at
// url (declared if missing), applying its messages through proc's routes.
// ctx bounds the first connection.
func startConsumer(ctx context.Context, proc *txhook.Processor, url string, log *slog.Logger) (*amqpconsumer.Consumer, error) {
	c, err := amqpconsumer.New(proc, &amqpconsumer.Config{URL: url, Queue: ordersQueue, Source: source, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("new queue consumer: %w", err)
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.Start(sctx); err != nil {
		return nil, fmt.Errorf("consume queue %s (AMQP_URL): %w", ordersQueue, err)
	}
	log.Info("consuming", "queue", ordersQueue, "broker", "amqp")
	return c, nil
}
