package handler

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Header names used by Shopify webhooks.
const (
	ShopifyHMACHeader      = "X-Shopify-Hmac-Sha256"
	ShopifyEventIDHeader   = "X-Shopify-Event-Id"
	ShopifyWebhookIDHeader = "X-Shopify-Webhook-Id"
	ShopifyTopicHeader     = "X-Shopify-Topic"
)

// Shopify verifies Shopify webhooks: X-Shopify-Hmac-Sha256 is the base64
// HMAC-SHA256 of the body keyed with the app's client secret. The key is
// X-Shopify-Event-Id (the same for every subscription receiving the event),
// or X-Shopify-Webhook-Id when that is absent; the type is X-Shopify-Topic.
//
// Shopify signs neither id header nor a timestamp, so the endpoint's body
// dedupe is on by default for this provider.
type Shopify struct {
	// Secrets are the app's client secrets; a signature matching any of
	// them is accepted (for rotation). Required.
	Secrets []string
}

// Validate reports a missing or empty secret.
func (s *Shopify) Validate() error { return nonEmpty(s.Secrets) }

// KeyUnsigned reports true: Shopify's id headers are not signed.
func (s *Shopify) KeyUnsigned() bool { return true }

// SharedBodies reports true: Shopify can send one change under several
// topics (products/create and products/update) with byte-identical bodies,
// so the body dedupe tells Shopify deliveries apart by topic and body.
func (s *Shopify) SharedBodies() bool { return true }

// Verify implements Provider.
func (s *Shopify) Verify(header http.Header, body []byte, _ time.Time) error {
	h := strings.TrimSpace(header.Get(ShopifyHMACHeader))
	if h == "" {
		return fmt.Errorf("%w: missing %s header", ErrSignature, ShopifyHMACHeader)
	}
	sig, err := base64.StdEncoding.DecodeString(h)
	if err != nil || len(sig) != sha256.Size {
		return fmt.Errorf("%w: %s is not base64 HMAC-SHA256", ErrSignature, ShopifyHMACHeader)
	}
	return verifyBodyMAC(s.Secrets, body, sig)
}

// Extract implements Provider.
func (s *Shopify) Extract(header http.Header, _ []byte) (Delivery, error) {
	key := header.Get(ShopifyEventIDHeader)
	if key == "" {
		key = header.Get(ShopifyWebhookIDHeader)
	}
	if key == "" {
		return Delivery{}, fmt.Errorf("%w: missing %s and %s headers", ErrMalformed, ShopifyEventIDHeader, ShopifyWebhookIDHeader)
	}
	return Delivery{Key: key, Type: header.Get(ShopifyTopicHeader)}, nil
}

// Sign implements Signer with the first secret. It sets only the HMAC
// header; the id and topic headers are the caller's.
func (s *Shopify) Sign(header http.Header, body []byte, _ time.Time) error {
	if err := s.Validate(); err != nil {
		return err
	}
	header.Set(ShopifyHMACHeader, base64.StdEncoding.EncodeToString(bodyMAC(s.Secrets[0], body)))
	return nil
}
