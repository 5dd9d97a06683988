package handler

import (
	"context"
	"time"
)

// Answer is what the endpoint did with a delivery, as reported to logs and
// to an Observer. The values are stable and suitable as metric labels.
type Answer string

// Answers to a delivery.
const (
	AnswerProcessed            Answer = "processed"              // 200: handler ran and committed
	AnswerQueued               Answer = "queued"                 // 202: accepted in inbox mode, applied later
	AnswerDuplicate            Answer = "duplicate"              // 200: key already committed
	AnswerDuplicateBody        Answer = "duplicate_body"         // 200: body already received under another key
	AnswerFailed               Answer = "failed"                 // 200: permanent handler error, recorded
	AnswerIgnored              Answer = "ignored"                // 200: no route for the type
	AnswerPing                 Answer = "ping"                   // 200: connectivity check
	AnswerInFlight             Answer = "in_flight"              // 409 or 503: held by another delivery
	AnswerMethodNotAllowed     Answer = "method_not_allowed"     // 405
	AnswerTooLarge             Answer = "too_large"              // 413
	AnswerTimeout              Answer = "timeout"                // 408: body not received within BodyReadTimeout
	AnswerUnsupportedMediaType Answer = "unsupported_media_type" // 415: GitHub delivery form-encoded, not JSON
	AnswerBadSignature         Answer = "bad_signature"          // 400: missing or wrong signature
	AnswerStaleTimestamp       Answer = "stale_timestamp"        // 400: signed timestamp out of tolerance
	AnswerBadRequest           Answer = "bad_request"            // 400: unreadable or malformed delivery, invalid key
	AnswerError                Answer = "error"                  // 500: handler error
	AnswerUnavailable          Answer = "unavailable"            // 503: database unreachable, commit outcome unknown
)

// Report describes one finished delivery. It never holds secrets or the
// payload.
type Report struct {
	// Source is the endpoint's source name.
	Source string
	// Key and Type are the event's key and type; empty when the delivery
	// was rejected before they were extracted, and cut to 256 bytes (with
	// "…" appended) when longer.
	Key  string
	Type string
	// Answer is what became of the delivery.
	Answer Answer
	// Status is the HTTP status answered.
	Status int
	// Duration is the time from receiving the request to answering it.
	Duration time.Duration
	// Err is the error behind a 4xx or 5xx answer, if any. It may carry
	// handler or database details: log it, do not send it to the sender.
	Err error
}

// Observer receives a Report for every delivery, after the answer is
// written. It is called synchronously and must be safe for concurrent use;
// keep it fast (count, record, return). See the otelhook module for an
// OpenTelemetry metrics adapter.
type Observer interface {
	ObserveDelivery(ctx context.Context, r Report)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(ctx context.Context, r Report)

// ObserveDelivery calls f.
func (f ObserverFunc) ObserveDelivery(ctx context.Context, r Report) { f(ctx, r) }
