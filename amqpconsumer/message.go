package amqpconsumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/internal/consume"
)

// Headers the consumer reads and writes.
const (
	// headerAttempt counts the attempts a message spent through the
	// retry queues: absent on the first, n on the (n+1)-th.
	headerAttempt = "x-txhook-attempt"
	// headerOutages counts the deliveries of a message that found the
	// database unusable: they spend no attempt, but lengthen the backoff.
	headerOutages = "x-txhook-outages"
	// headerRoutingKey keeps the routing key a message was first
	// published with: the retry queues deliver it back under Queue's name.
	headerRoutingKey = "x-txhook-routing-key"
	// headerError says why a message was sent to the dead-letter queue.
	headerError = "x-txhook-error"
	// headerCopy numbers the copies a session publishes, to tell which
	// one the broker returned.
	headerCopy = "x-txhook-copy"
	// headerDeliveryCount is the quorum queue's count of the deliveries of
	// a message that ended unanswered before this one.
	headerDeliveryCount = "x-delivery-count"
	// headerDeath is the broker's record of a message's dead-lettering.
	headerDeath = "x-death"
)

// handle applies d and acknowledges it, sends it to retry, or to the
// dead-letter queue, as its answer says.
func (c *Consumer) handle(s *session, d amqp.Delivery) {
	start := time.Now()
	ctx := c.work
	prior := intHeader(d.Headers, headerAttempt)
	outages := intHeader(d.Headers, headerOutages)
	attempt := prior + 1
	last := attempt >= c.cfg.MaxAttempts || intHeader(d.Headers, headerDeliveryCount) >= c.cfg.DeliveryLimit
	ev := txhook.Event{Source: c.cfg.Source, Key: d.MessageId, Type: c.eventType(d), Payload: d.Body}
	res, err := c.proc.Deliver(ctx, ev, &txhook.DeliverOptions{LastAttempt: last})
	// The backoff grows with every delivery, the outages' among them.
	deliveries := attempt + outages
	dec := consume.Decide(res, err, deliveries, c.backoff)
	var settleErr error
	switch dec.Action {
	case consume.Ack:
		settleErr = d.Ack(false)
	case consume.Retry:
		spent := attempt
		if dec.Answer == handler.AnswerUnavailable {
			// Nothing could be recorded: the delivery spends no attempt,
			// so that an outage does not leave a message with none.
			spent, outages = prior, outages+1
		}
		settleErr = c.retry(ctx, s, d, min(spent, c.cfg.MaxAttempts), outages, min(dec.Delay, c.backoff.Max))
	default:
		settleErr = c.deadLetter(ctx, s, d, dec.Err)
	}
	if errors.Is(settleErr, errCopyFailed) {
		// The copy could not be published: give the message back to its
		// queue, but only after the attempt's backoff, or the broker would
		// hand it straight back and the consumer spin on a failing publish.
		settleErr = c.giveBack(d, settleErr, c.backoff.Delay(deliveries))
	}
	consume.Report(ctx, c.log, c.cfg.Observer, transport, dec.Action, handler.Report{
		Source: c.cfg.Source, Key: ev.Key, Type: ev.Type, Answer: dec.Answer, Duration: time.Since(start), Err: dec.Err,
	})
	if settleErr != nil {
		// The message stays unacknowledged on a channel that is gone or
		// failing: the broker delivers it again, and a committed event's
		// redelivery is a duplicate.
		c.log.Warn("amqpconsumer: message not settled; the broker will deliver it again",
			"source", c.cfg.Source, "key", ev.Key, "action", dec.Action.String(), "error", settleErr)
	}
}

// eventType is d's event type: its type property, or with
// TypeFromRoutingKey the routing key it was first published with.
func (c *Consumer) eventType(d amqp.Delivery) string {
	if !c.cfg.TypeFromRoutingKey {
		return d.Type
	}
	if rk, ok := d.Headers[headerRoutingKey].(string); ok {
		return rk
	}
	return d.RoutingKey
}

// retry publishes a copy of d, marked with the attempts it spent and the
// outages it met, to the retry queue of wait, and acknowledges d once the
// broker confirmed the copy.
func (c *Consumer) retry(ctx context.Context, s *session, d amqp.Delivery, spent, outages int, wait time.Duration) error {
	q, err := s.retryQueue(retryWait(wait))
	if err != nil {
		return fmt.Errorf("retry: %w: %w", errCopyFailed, err)
	}
	p := copyOf(d)
	p.Headers[headerAttempt] = int64(spent)
	if outages > 0 {
		p.Headers[headerOutages] = int64(outages)
	}
	if _, ok := p.Headers[headerRoutingKey]; !ok {
		p.Headers[headerRoutingKey] = d.RoutingKey
	}
	return moveTo(ctx, s, d, q, p)
}

// deadLetter publishes a copy of d to the dead-letter queue, with why in
// its x-txhook-error header, and acknowledges d once the broker confirmed
// the copy.
func (c *Consumer) deadLetter(ctx context.Context, s *session, d amqp.Delivery, why error) error {
	p := copyOf(d)
	if why != nil {
		p.Headers[headerError] = why.Error()
	}
	q, err := s.ensure(c.cfg.DeadLetterQueue, deadArgs)
	if err != nil {
		return fmt.Errorf("dead letter: %w: %w", errCopyFailed, err)
	}
	return moveTo(ctx, s, d, q, p)
}

// errCopyFailed marks an error of a copy of a message that could not be
// published: the message is still unacknowledged, for handle to give back.
var errCopyFailed = errors.New("copy not published")

// moveTo publishes p, d's copy, to queue and acknowledges d once the broker
// confirmed the copy: only then is the copy the broker's to keep. A copy
// that cannot be published leaves d unacknowledged, with an error matching
// errCopyFailed.
func moveTo(ctx context.Context, s *session, d amqp.Delivery, queue string, p amqp.Publishing) error {
	if err := s.publish(ctx, queue, p); err != nil {
		return fmt.Errorf("%w to %q: %w", errCopyFailed, queue, err)
	}
	if err := d.Ack(false); err != nil {
		return fmt.Errorf("acknowledge after publishing its copy to %q: %w", queue, err)
	}
	return nil
}

// giveBack returns d to its queue (a nack with requeue) after wait, or at
// once when the Consumer stops, after err: what could not move it to a
// retry or dead-letter queue.
func (c *Consumer) giveBack(d amqp.Delivery, err error, wait time.Duration) error {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-c.stop:
	case <-c.work.Done():
	}
	if nerr := d.Nack(false, true); nerr != nil {
		return fmt.Errorf("%w; give the message back: %w", err, nerr)
	}
	return fmt.Errorf("%w (given back to the queue after %s)", err, wait)
}

// copyOf is d as a persistent message to publish again: its properties
// and headers, less the broker's delivery records, its expiration (the
// retry queue sets the wait) and its user-id (the broker checks it
// against the connection's user).
func copyOf(d amqp.Delivery) amqp.Publishing {
	h := make(amqp.Table, len(d.Headers)+2)
	for k, v := range d.Headers {
		if k != headerDeliveryCount && k != headerDeath && k != headerCopy {
			h[k] = v
		}
	}
	return amqp.Publishing{
		Headers:         h,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}

// intHeader reads an integer header of any of the AMQP integer types (or
// a decimal string); 0 when absent or unreadable.
func intHeader(h amqp.Table, name string) int {
	switch v := h[name].(type) {
	case int64:
		return int(v)
	case int32:
		return int(v)
	case int16:
		return int(v)
	case int8:
		return int(v)
	case uint8:
		return int(v)
	case uint16:
		return int(v)
	case uint32:
		return int(v)
	case int:
		return v
	case string:
		n, _ := strconv.Atoi(v)
		return n
	}
	return 0
}
