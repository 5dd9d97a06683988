package txhook

import (
	"strings"
	"unicode/utf8"
)

// Event is an event as a delivery carries it to the processor: the same on
// every delivery of the event.
type Event struct {
	// Source names the sender's events ("stripe", "github-prod"): an HTTP
	// endpoint's, a queue consumer's. Keys are unique per source: two
	// sources may receive the same provider id and each processes it once.
	Source string
	// Key is the provider's stable event id: the same on every retry and
	// redelivery of the event, different for every event (Stripe's evt_…,
	// GitHub's X-GitHub-Delivery, Standard Webhooks' webhook-id). Never a
	// value made on receipt, and never the business object's id.
	Key string
	// Type is the event type ("invoice.paid"); optional.
	Type string
	// Payload is the event's body. It is stored only when the processor is
	// configured to keep payloads (for replay).
	Payload []byte
	// PayloadHash is an optional digest of the signed body, stored for the
	// body dedupe of providers whose event ids are not signed.
	PayloadHash []byte
}

// Limits applied by Validate.
const (
	// maxSourceLen is the longest accepted source, in bytes.
	maxSourceLen = 128
	// DefaultMaxKeyLen is the longest accepted key, in bytes, unless
	// Config.MaxKeyLen says otherwise.
	DefaultMaxKeyLen = 255
	// maxTypeLen is the longest accepted event type, in bytes.
	maxTypeLen = 255
)

// Validate checks ev against the processor's rules with the default key
// limit: non-empty source and key; at most 128 bytes of source,
// DefaultMaxKeyLen of key and 255 of type; valid UTF-8 and no NUL bytes in
// all three. The error is a *ValidationError matching
// ErrInvalidEvent.
func (ev Event) Validate() error { return ev.validate(DefaultMaxKeyLen) }

func (ev Event) validate(maxKeyLen int) error {
	if ev.Source == "" {
		return &ValidationError{Field: "source", Err: ErrEmpty}
	}
	if err := checkText(ev.Source, maxSourceLen); err != nil {
		return &ValidationError{Field: "source", Err: err}
	}
	if ev.Key == "" {
		return &ValidationError{Field: "key", Err: ErrEmpty}
	}
	if err := checkText(ev.Key, maxKeyLen); err != nil {
		return &ValidationError{Field: "key", Err: err}
	}
	if err := checkText(ev.Type, maxTypeLen); err != nil {
		return &ValidationError{Field: "type", Err: err}
	}
	return nil
}

func checkText(s string, maxLen int) error {
	switch {
	case len(s) > maxLen:
		return ErrTooLong
	case !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0:
		return ErrNotText
	}
	return nil
}
