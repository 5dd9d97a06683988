package handler

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// StripeSignatureHeader is the header carrying Stripe's signature.
const StripeSignatureHeader = "Stripe-Signature"

// Stripe verifies Stripe webhooks: the Stripe-Signature header
// "t=<unix>,v1=<hex>[,v1=<hex>…]" carries HMAC-SHA256 signatures of
// "<t>.<body>" keyed with the endpoint's signing secret (whsec_…, used as
// is). The key is the event's "id" (evt_…) and the type its "type", both
// from the signed JSON body.
type Stripe struct {
	// Secrets are the endpoint signing secrets. A signature matching any of
	// them is accepted, so a rolled secret and its successor can both be
	// listed while Stripe signs with both. Required.
	Secrets []string
	// Tolerance is how far t may be from now. Defaults to DefaultTolerance
	// (300 s, as in Stripe's libraries).
	Tolerance time.Duration
}

// Validate reports a missing or empty secret.
func (s *Stripe) Validate() error { return nonEmpty(s.Secrets) }

// Verify implements Provider.
func (s *Stripe) Verify(header http.Header, body []byte, now time.Time) error {
	t, sigs, err := parseStripeHeader(header.Get(StripeSignatureHeader))
	if err != nil {
		return err
	}
	if _, err := checkTimestamp(t, now, s.Tolerance); err != nil {
		return err
	}
	want := make([][]byte, 0, len(s.Secrets))
	for _, secret := range s.Secrets {
		want = append(want, stripeMAC(secret, t, body))
	}
	if !anyEqual(want, sigs) {
		return fmt.Errorf("%w: no v1 signature matches", ErrSignature)
	}
	return nil
}

// Extract implements Provider. An id or type that is not valid UTF-8 text
// (raw bytes that are not UTF-8, an escaped surrogate that is not half of a
// pair) is refused with ErrMalformed: decoded, it would become U+FFFD and
// could match another event's id.
func (s *Stripe) Extract(_ http.Header, body []byte) (Delivery, error) {
	var ev struct {
		ID   jsonField `json:"id"`
		Type jsonField `json:"type"`
	}
	if err := json.Unmarshal(body, &ev); err != nil {
		return Delivery{}, fmt.Errorf("%w: body is not a Stripe event", ErrMalformed)
	}
	id, err := jsonText(ev.ID, "id")
	if err != nil {
		return Delivery{}, err
	}
	if id == "" {
		return Delivery{}, fmt.Errorf("%w: event has no id", ErrMalformed)
	}
	typ, err := jsonText(ev.Type, "type")
	if err != nil {
		return Delivery{}, err
	}
	return Delivery{Key: id, Type: typ}, nil
}

// Sign implements Signer with the first secret.
func (s *Stripe) Sign(header http.Header, body []byte, now time.Time) error {
	if err := s.Validate(); err != nil {
		return err
	}
	t := strconv.FormatInt(now.Unix(), 10)
	header.Set(StripeSignatureHeader, "t="+t+",v1="+hex.EncodeToString(stripeMAC(s.Secrets[0], t, body)))
	return nil
}

func stripeMAC(secret, t string, body []byte) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(t))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// parseStripeHeader returns the t value and the decoded v1 signatures.
// Other schemes (v0, test-mode extras) are ignored, as Stripe's libraries do.
func parseStripeHeader(h string) (string, [][]byte, error) {
	if h == "" {
		return "", nil, fmt.Errorf("%w: missing %s header", ErrSignature, StripeSignatureHeader)
	}
	var t string
	var sigs [][]byte
	for item := range strings.SplitSeq(h, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok {
			continue
		}
		switch k {
		case "t":
			t = v
		case "v1":
			if len(sigs) == maxSignatures {
				continue
			}
			b, err := hex.DecodeString(v)
			if err != nil || len(b) != sha256.Size {
				continue
			}
			sigs = append(sigs, b)
		}
	}
	if len(sigs) == 0 {
		return "", nil, fmt.Errorf("%w: no v1 signature", ErrSignature)
	}
	if t == "" {
		return "", nil, fmt.Errorf("%w: no timestamp in %s header", ErrTimestamp, StripeSignatureHeader)
	}
	return t, sigs, nil
}
