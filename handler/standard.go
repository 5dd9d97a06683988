package handler

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Header names of the Standard Webhooks specification, and Svix's names for
// the same headers.
const (
	StandardIDHeader        = "Webhook-Id"
	StandardTimestampHeader = "Webhook-Timestamp"
	StandardSignatureHeader = "Webhook-Signature"
	SvixIDHeader            = "Svix-Id"
	SvixTimestampHeader     = "Svix-Timestamp"
	SvixSignatureHeader     = "Svix-Signature"
)

// StandardWebhooks verifies deliveries that follow the Standard Webhooks
// specification, as sent by Svix and others. The webhook-signature header
// is a space-separated list of "v1,<base64>" signatures, each the
// HMAC-SHA256 of "<webhook-id>.<webhook-timestamp>.<body>" keyed with the
// base64-decoded secret ("whsec_<base64>"). Svix's svix-id, svix-timestamp
// and svix-signature headers are accepted when the webhook-* ones are
// absent. The key is webhook-id (signed) and the type the body's "type"
// field, when the body is a JSON object that has one.
type StandardWebhooks struct {
	// Secrets are the endpoint secrets, "whsec_<base64>" (the prefix is
	// optional). A signature matching any of them is accepted (rotation).
	// Required.
	Secrets []string
	// Tolerance is how far webhook-timestamp may be from now. Defaults to
	// DefaultTolerance (5 minutes, as the specification recommends).
	Tolerance time.Duration
}

// Validate reports a missing secret or one that is not valid base64.
func (s *StandardWebhooks) Validate() error {
	if err := nonEmpty(s.Secrets); err != nil {
		return err
	}
	for i, sec := range s.Secrets {
		if _, err := standardKey(sec); err != nil {
			return fmt.Errorf("secret %d: %w", i, err)
		}
	}
	return nil
}

// Verify implements Provider.
func (s *StandardWebhooks) Verify(header http.Header, body []byte, now time.Time) error {
	id, ts, sigHeader := standardHeaders(header)
	if id == "" {
		return fmt.Errorf("%w: missing webhook-id header", ErrSignature)
	}
	if _, err := checkTimestamp(ts, now, s.Tolerance); err != nil {
		return err
	}
	sigs := parseStandardSignatures(sigHeader)
	if len(sigs) == 0 {
		return fmt.Errorf("%w: no v1 signature", ErrSignature)
	}
	want := make([][]byte, 0, len(s.Secrets))
	for _, sec := range s.Secrets {
		key, err := standardKey(sec)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrNoSecret, err)
		}
		want = append(want, standardMAC(key, id, ts, body))
	}
	if !anyEqual(want, sigs) {
		return fmt.Errorf("%w: no v1 signature matches", ErrSignature)
	}
	return nil
}

// Extract implements Provider. A "type" that is a string but not valid UTF-8
// text is refused with ErrMalformed, as Stripe's id is; one that is not a
// string is no type.
func (s *StandardWebhooks) Extract(header http.Header, body []byte) (Delivery, error) {
	id, _, _ := standardHeaders(header)
	if id == "" {
		return Delivery{}, fmt.Errorf("%w: missing webhook-id header", ErrMalformed)
	}
	var payload struct {
		Type jsonField `json:"type"`
	}
	d := Delivery{Key: id}
	if json.Unmarshal(body, &payload) == nil {
		t, err := jsonText(payload.Type, "type")
		switch {
		case errors.Is(err, errNotString): // no type
		case err != nil:
			return Delivery{}, err
		default:
			d.Type = t
		}
	}
	return d, nil
}

// Sign implements Signer with the first secret, setting the webhook-id
// (unless already set), webhook-timestamp and webhook-signature headers.
func (s *StandardWebhooks) Sign(header http.Header, body []byte, now time.Time) error {
	if err := s.Validate(); err != nil {
		return err
	}
	key, _ := standardKey(s.Secrets[0])
	id, _, _ := standardHeaders(header)
	if id == "" {
		return fmt.Errorf("%w: set the webhook-id header before signing", ErrMalformed)
	}
	ts := strconv.FormatInt(now.Unix(), 10)
	header.Set(StandardIDHeader, id)
	header.Set(StandardTimestampHeader, ts)
	header.Set(StandardSignatureHeader, "v1,"+base64.StdEncoding.EncodeToString(standardMAC(key, id, ts, body)))
	return nil
}

// standardHeaders returns id, timestamp and signature, from the webhook-*
// headers if webhook-id is present, otherwise from the svix-* headers.
func standardHeaders(h http.Header) (id, ts, sig string) {
	if id = h.Get(StandardIDHeader); id != "" {
		return id, h.Get(StandardTimestampHeader), h.Get(StandardSignatureHeader)
	}
	return h.Get(SvixIDHeader), h.Get(SvixTimestampHeader), h.Get(SvixSignatureHeader)
}

func standardKey(secret string) ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil || len(b) == 0 {
		return nil, fmt.Errorf("%w: secret is not whsec_<base64>", ErrNoSecret)
	}
	return b, nil
}

func standardMAC(key []byte, id, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// parseStandardSignatures returns the decoded v1 signatures of a
// space-separated "v1,<base64>" list, ignoring other versions.
func parseStandardSignatures(h string) [][]byte {
	var sigs [][]byte
	for item := range strings.FieldsSeq(h) {
		if len(sigs) == maxSignatures {
			break
		}
		v, sig, ok := strings.Cut(item, ",")
		if !ok || v != "v1" {
			continue
		}
		b, err := base64.StdEncoding.DecodeString(sig)
		if err != nil || len(b) != sha256.Size {
			continue
		}
		sigs = append(sigs, b)
	}
	return sigs
}
