package handler

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Header names used by GitHub webhooks.
const (
	GitHubSignatureHeader = "X-Hub-Signature-256"
	GitHubDeliveryHeader  = "X-GitHub-Delivery"
	GitHubEventHeader     = "X-GitHub-Event"
)

// GitHub verifies GitHub webhooks: X-Hub-Signature-256 is "sha256=" and the
// hex HMAC-SHA256 of the body keyed with the webhook secret. The key is the
// X-GitHub-Delivery header (kept on redelivery) and the type the
// X-GitHub-Event header; a "ping" is answered 200 without running anything.
//
// GitHub signs neither the delivery id nor a timestamp, so the endpoint's
// body dedupe is on by default for this provider.
//
// A webhook whose content type is application/x-www-form-urlencoded sends
// its JSON urlencoded in a "payload" form field; the endpoint answers such
// deliveries 415 (AnswerUnsupportedMediaType) without reading them: configure
// the webhook's content type as application/json.
type GitHub struct {
	// Secrets are the webhook secrets; a signature matching any of them is
	// accepted (for rotation). Required.
	Secrets []string
}

// Validate reports a missing or empty secret.
func (g *GitHub) Validate() error { return nonEmpty(g.Secrets) }

// KeyUnsigned reports true: X-GitHub-Delivery is not signed.
func (g *GitHub) KeyUnsigned() bool { return true }

// Verify implements Provider.
func (g *GitHub) Verify(header http.Header, body []byte, _ time.Time) error {
	sig, err := parseGitHubSignature(header.Get(GitHubSignatureHeader))
	if err != nil {
		return err
	}
	return verifyBodyMAC(g.Secrets, body, sig)
}

// Extract implements Provider.
func (g *GitHub) Extract(header http.Header, _ []byte) (Delivery, error) {
	d := Delivery{Key: header.Get(GitHubDeliveryHeader), Type: header.Get(GitHubEventHeader)}
	if d.Key == "" {
		return Delivery{}, fmt.Errorf("%w: missing %s header", ErrMalformed, GitHubDeliveryHeader)
	}
	if d.Type == "" {
		return Delivery{}, fmt.Errorf("%w: missing %s header", ErrMalformed, GitHubEventHeader)
	}
	d.Ping = d.Type == "ping"
	return d, nil
}

// Sign implements Signer with the first secret. It sets only the signature
// header; the delivery and event headers are the caller's.
func (g *GitHub) Sign(header http.Header, body []byte, _ time.Time) error {
	if err := g.Validate(); err != nil {
		return err
	}
	header.Set(GitHubSignatureHeader, "sha256="+hex.EncodeToString(bodyMAC(g.Secrets[0], body)))
	return nil
}

func parseGitHubSignature(h string) ([]byte, error) {
	if h == "" {
		return nil, fmt.Errorf("%w: missing %s header", ErrSignature, GitHubSignatureHeader)
	}
	hexSig, ok := strings.CutPrefix(h, "sha256=")
	if !ok {
		return nil, fmt.Errorf("%w: %s is not sha256=<hex>", ErrSignature, GitHubSignatureHeader)
	}
	sig, err := hex.DecodeString(hexSig)
	if err != nil || len(sig) != sha256.Size {
		return nil, fmt.Errorf("%w: %s is not sha256=<hex>", ErrSignature, GitHubSignatureHeader)
	}
	return sig, nil
}

// bodyMAC is the HMAC-SHA256 of body keyed with secret's bytes.
func bodyMAC(secret string, body []byte) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return m.Sum(nil)
}

func verifyBodyMAC(secrets []string, body, sig []byte) error {
	ok := false
	for _, s := range secrets {
		if hmac.Equal(bodyMAC(s, body), sig) {
			ok = true
		}
	}
	if !ok {
		return fmt.Errorf("%w: signature matches no secret", ErrSignature)
	}
	return nil
}

// isGitHub reports whether p is the GitHub provider, whose webhooks can be
// configured to send form-encoded bodies.
func isGitHub(p Provider) bool {
	_, ok := p.(*GitHub)
	return ok
}

// formEncoded reports whether h declares an
// application/x-www-form-urlencoded body (GitHub's "form" content type).
func formEncoded(h http.Header) bool {
	mt, _, _ := strings.Cut(h.Get("Content-Type"), ";")
	return strings.EqualFold(strings.TrimSpace(mt), "application/x-www-form-urlencoded")
}
