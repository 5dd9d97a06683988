package handler

import (
	"bytes"
	"crypto/hmac"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/txhook/txhook"
)

// Provider verifies and identifies deliveries from one kind of sender.
//
// The endpoint calls Verify on the raw body before anything is parsed or
// written, then Extract. Both must be safe for concurrent use, must not
// retain body, and must do work bounded by the size of their input.
type Provider interface {
	// Verify checks the delivery's signature (and signed timestamp, if the
	// scheme has one) against now. The error should wrap ErrSignature or
	// ErrTimestamp; any error rejects the delivery with 400.
	Verify(header http.Header, body []byte, now time.Time) error
	// Extract returns the event's stable key and type. An error (it should
	// wrap ErrMalformed) rejects the delivery with 400.
	Extract(header http.Header, body []byte) (Delivery, error)
}

// Delivery is what a Provider extracts from a verified request.
type Delivery struct {
	// Key is the provider's stable event id (see txhook.Event.Key).
	Key string
	// Type is the event type used for routing.
	Type string
	// Ping marks a connectivity check (GitHub's "ping"): it is answered 200
	// and nothing runs or is written.
	Ping bool
}

// Signer is implemented by providers that can sign a delivery the way the
// sender would, with their first secret. It is meant for tests and local
// tools: Sign sets the signature headers (and, where the scheme signs a
// timestamp, the timestamp header) on header.
type Signer interface {
	Sign(header http.Header, body []byte, now time.Time) error
}

// KeyUnsigned is implemented by providers that can say whether a delivery's
// identity is covered by the signature: it reports true when the event key
// or the event type is read from outside it (an unsigned header), since
// either lets a captured body and signature be sent again as another
// delivery (a fresh key, or a type whose route runs something else). When
// it reports true, the endpoint's body dedupe is on by default (see
// Config.BodyDedupe).
type KeyUnsigned interface {
	KeyUnsigned() bool
}

// Validator is implemented by providers that can check their own
// configuration; New calls it so that a missing secret fails at startup
// rather than on the first delivery.
type Validator interface {
	Validate() error
}

// Errors reported by providers. The endpoint answers all of them with 400
// and a body naming only the class of error.
var (
	// ErrSignature: the signature header is missing, malformed, or matches
	// none of the secrets.
	ErrSignature = errors.New("handler: invalid signature")
	// ErrTimestamp: the signed timestamp is missing, malformed, or outside
	// the tolerance.
	ErrTimestamp = errors.New("handler: invalid or stale timestamp")
	// ErrMalformed: the delivery is signed but its key or type cannot be
	// extracted (bad JSON, missing header).
	ErrMalformed = errors.New("handler: malformed delivery")
	// ErrNoSecret: a provider was configured without a usable secret.
	ErrNoSecret = errors.New("handler: no secret configured")
)

// DefaultTolerance is how far a signed timestamp may be from now, in either
// direction, for providers that sign one (Stripe, Standard Webhooks).
const DefaultTolerance = 5 * time.Minute

// maxSignatures bounds how many signatures of one header are compared, so
// that a hostile header cannot make verification do unbounded work.
const maxSignatures = 16

// anyEqual reports whether any of sigs equals any of want, comparing in
// constant time for equal lengths.
func anyEqual(want, sigs [][]byte) bool {
	ok := false
	for _, s := range sigs {
		for _, w := range want {
			if hmac.Equal(s, w) {
				ok = true
			}
		}
	}
	return ok
}

// checkTimestamp parses a decimal Unix timestamp and checks it against now.
func checkTimestamp(s string, now time.Time, tolerance time.Duration) (int64, error) {
	if s == "" {
		return 0, fmt.Errorf("%w: missing", ErrTimestamp)
	}
	ts, err := strconv.ParseInt(s, 10, 64)
	if err != nil || ts < 0 {
		return 0, fmt.Errorf("%w: not a Unix time", ErrTimestamp)
	}
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	// Compare in seconds, which cannot overflow for any int64 ts.
	d := now.Unix() - ts
	limit := int64(tolerance / time.Second)
	if d > limit || -d > limit {
		return 0, fmt.Errorf("%w: outside tolerance", ErrTimestamp)
	}
	return ts, nil
}

// jsonFields reads top-level string fields of a JSON object body (see
// jsonText).
func jsonFields(body []byte, names ...string) ([]string, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil {
		return nil, fmt.Errorf("%w: body is not a JSON object", ErrMalformed)
	}
	out := make([]string, len(names))
	for i, n := range names {
		raw, ok := obj[n]
		if !ok {
			continue
		}
		var err error
		if out[i], err = jsonText(raw, n); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// jsonField is a JSON value of a signed body kept as it is, for jsonText:
// the bytes of the body itself, where json.RawMessage would copy them. It
// is read before Extract returns, while the body is still the caller's.
type jsonField []byte

// UnmarshalJSON implements json.Unmarshaler.
func (f *jsonField) UnmarshalJSON(b []byte) error {
	*f = b
	return nil
}

// errNotString is jsonText's error for a value that is not a string.
var errNotString = fmt.Errorf("%w: not a string", ErrMalformed)

// jsonText returns the string the JSON value raw (the field name of a
// signed body) holds, "" for null. encoding/json turns bytes that are not
// valid UTF-8, and an escaped surrogate (\ud800 to \udfff) that is not half
// of a pair, into U+FFFD: two keys that differ only there would decode to
// one, and the second event be answered as a duplicate of the first. Such a
// string is refused (ErrMalformed and txhook.ErrNotText), as a header
// holding it is; so is any other value that is not a string
// (errNotString).
func jsonText(raw []byte, name string) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	if raw[0] != '"' {
		return "", fmt.Errorf("%w: field %q", errNotString, name)
	}
	if !lossless(raw) {
		return "", fmt.Errorf("%w: field %q is not valid UTF-8 text: %w", ErrMalformed, name, txhook.ErrNotText)
	}
	if bytes.IndexByte(raw, '\\') < 0 { // nothing to unescape
		return string(raw[1 : len(raw)-1]), nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("%w: field %q", errNotString, name)
	}
	return s, nil
}

// lossless reports whether tok, a JSON string token from a valid document,
// decodes to exactly what it spells: its bytes are valid UTF-8 and every
// escaped surrogate is half of a pair.
func lossless(tok []byte) bool {
	if !utf8.Valid(tok) {
		return false
	}
	for i := 1; i < len(tok)-1; i++ {
		if tok[i] != '\\' {
			continue
		}
		i++
		if tok[i] != 'u' {
			continue
		}
		r := escapedRune(tok[i+1:])
		i += 4
		if !utf16.IsSurrogate(r) {
			continue
		}
		if r >= 0xdc00 { // a second half with no first
			return false
		}
		rest := tok[i+1:]
		if len(rest) < 6 || rest[0] != '\\' || rest[1] != 'u' {
			return false
		}
		if low := escapedRune(rest[2:]); low < 0xdc00 || low > 0xdfff {
			return false
		}
		i += 6
	}
	return true
}

// escapedRune decodes the four hex digits that start h (of a \u escape).
func escapedRune(h []byte) rune {
	v, _ := strconv.ParseUint(string(h[:4]), 16, 32)
	return rune(v)
}

func nonEmpty(secrets []string) error {
	if len(secrets) == 0 {
		return ErrNoSecret
	}
	for _, s := range secrets {
		if s == "" {
			return fmt.Errorf("%w: empty secret", ErrNoSecret)
		}
	}
	return nil
}
