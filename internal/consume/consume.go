// Package consume is what txhook's queue consumers (natsconsumer,
// amqpconsumer) share: what to do with a broker message once
// Processor.Deliver has answered, the redelivery backoff, and the report of
// each message to the logs and to a handler.Observer, in the shape the HTTP
// endpoint uses.
//
// The rule is the endpoint's: a message is acknowledged only when its event
// is settled in the events table (processed, duplicate, failed: a dead letter
// an operator can replay), needs nothing (ignored: no route), or is stored to
// be applied later (queued, inbox mode). Anything else is redelivered after a
// delay, so that nothing is acknowledged that was not committed.
package consume

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/internal/clip"
)

// Action is what a consumer does with a message once Deliver has answered.
type Action int

// Actions.
const (
	// Ack: the event is settled or stored; the message may go.
	Ack Action = iota + 1
	// Retry: the broker must deliver the message again after Decision.Delay:
	// another delivery holds the key, the handler failed, the database could
	// not be used, or the commit's outcome is unknown.
	Retry
	// Reject: the message can never be applied (no usable key, an invalid
	// type): it goes to the dead-letter destination, never applied.
	Reject
)

// String names the action, for logs.
func (a Action) String() string {
	switch a {
	case Ack:
		return "ack"
	case Retry:
		return "retry"
	case Reject:
		return "reject"
	}
	return "unknown"
}

// Decision is what to do with one message, and what to report of it.
type Decision struct {
	Action Action
	// Delay is how long the broker should wait before the next delivery,
	// for Retry.
	Delay time.Duration
	// Answer is the outcome, in the endpoint's vocabulary, for logs and
	// metrics.
	Answer handler.Answer
	// Err is the error behind a Retry or Reject, or the handler's permanent
	// error behind a failed event.
	Err error
}

// Decide maps Deliver's answer for a message delivered for the attempt-th
// time (1 for the first) to its Decision. In flight waits the Retry-After
// Deliver gave; errors wait b's backoff for the attempt.
//
// Only txhook's own errors say that the database could not be used
// (ErrUnavailable, ErrCommitUnknown), unlike the HTTP endpoint, which also
// answers 503 for a handler's error that engine.Unreachable recognises: a
// consumer keeps a message whose database was unavailable without spending
// its deliveries, so a handler's own error (a network error from a service
// it calls among them) must spend one, or a message that always fails would
// never become a dead letter.
func Decide(res txhook.Result, err error, attempt int, b Backoff) Decision {
	if err != nil {
		switch {
		case errors.Is(err, txhook.ErrInvalidEvent):
			return Decision{Action: Reject, Answer: handler.AnswerBadRequest, Err: err}
		case errors.Is(err, txhook.ErrUnavailable), errors.Is(err, txhook.ErrCommitUnknown):
			return Decision{Action: Retry, Delay: b.Delay(attempt), Answer: handler.AnswerUnavailable, Err: err}
		}
		return Decision{Action: Retry, Delay: b.Delay(attempt), Answer: handler.AnswerError, Err: err}
	}
	switch res.Outcome {
	case txhook.OutcomeProcessed:
		return Decision{Action: Ack, Answer: handler.AnswerProcessed}
	case txhook.OutcomeDuplicate:
		return Decision{Action: Ack, Answer: handler.AnswerDuplicate}
	case txhook.OutcomeFailed:
		return Decision{Action: Ack, Answer: handler.AnswerFailed, Err: res.Err}
	case txhook.OutcomeIgnored:
		return Decision{Action: Ack, Answer: handler.AnswerIgnored}
	case txhook.OutcomeQueued:
		return Decision{Action: Ack, Answer: handler.AnswerQueued}
	case txhook.OutcomeInFlight:
		return Decision{Action: Retry, Delay: max(res.RetryAfter, time.Second), Answer: handler.AnswerInFlight}
	}
	return Decision{Action: Retry, Delay: b.Delay(attempt), Answer: handler.AnswerError,
		Err: errors.New("deliver: unexpected outcome " + res.Outcome.String())}
}

// Backoff is the wait before redelivering a message whose delivery failed:
// Base for the first attempt, doubling with each later one up to Max, with
// up to a quarter of jitter either way so that a failed batch does not come
// back at once. Zero fields take DefaultBackoff's.
type Backoff struct {
	Base, Max time.Duration
}

// DefaultBackoff is the backoff of a consumer that sets none: 1s, doubling
// to at most 5 minutes.
var DefaultBackoff = Backoff{Base: time.Second, Max: 5 * time.Minute}

// Delay returns the wait after the attempt-th delivery failed.
func (b Backoff) Delay(attempt int) time.Duration {
	if b.Base <= 0 {
		b.Base = DefaultBackoff.Base
	}
	if b.Max <= 0 {
		b.Max = DefaultBackoff.Max
	}
	d := b.Base
	for i := 1; i < attempt && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	jitter := time.Duration(rand.Int64N(int64(d)/2+1)) - d/4
	return max(d+jitter, time.Millisecond)
}

// Report logs r as the HTTP endpoint logs a delivery ("txhook: delivery",
// with the same attributes, the transport and the action besides) and hands
// it to obs when set. r.Status is 0: a message has no HTTP status. Its key
// and type are cut to clip.Max bytes, as the endpoint's are.
func Report(ctx context.Context, log *slog.Logger, obs handler.Observer, transport string, action Action, r handler.Report) {
	r.Key, r.Type = clip.Reported(r.Key), clip.Reported(r.Type)
	level := slog.LevelInfo
	switch {
	case r.Answer == handler.AnswerError || r.Answer == handler.AnswerUnavailable:
		level = slog.LevelError
	case action != Ack || r.Answer == handler.AnswerFailed:
		level = slog.LevelWarn
	}
	attrs := []slog.Attr{
		slog.String("source", r.Source),
		slog.String("key", r.Key),
		slog.String("type", r.Type),
		slog.String("outcome", string(r.Answer)),
		slog.String("transport", transport),
		slog.String("action", action.String()),
		slog.Duration("duration", r.Duration),
	}
	if r.Err != nil {
		attrs = append(attrs, slog.String("error", r.Err.Error()))
	}
	log.LogAttrs(ctx, level, "txhook: delivery", attrs...)
	if obs != nil {
		obs.ObserveDelivery(ctx, r)
	}
}
