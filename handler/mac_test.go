package handler_test

import (
	"crypto/sha1"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/handler"
)

// macCodec reads and writes the MAC in a provider's signature header, so
// that a test can alter a correct signature byte by byte.
type macCodec struct {
	header string
	prefix string // before the encoded MAC
	base64 bool   // else hex
}

func (c macCodec) get(t *testing.T, h http.Header) []byte {
	t.Helper()
	v, ok := strings.CutPrefix(h.Get(c.header), c.prefix)
	if !ok {
		t.Fatalf("%s = %q, want prefix %q", c.header, h.Get(c.header), c.prefix)
	}
	var mac []byte
	var err error
	if c.base64 {
		mac, err = base64.StdEncoding.DecodeString(v)
	} else {
		mac, err = hex.DecodeString(v)
	}
	if err != nil {
		t.Fatalf("decode %s: %v", c.header, err)
	}
	return mac
}

func (c macCodec) set(h http.Header, mac []byte) {
	enc := hex.EncodeToString(mac)
	if c.base64 {
		enc = base64.StdEncoding.EncodeToString(mac)
	}
	h.Set(c.header, c.prefix+enc)
}

// stripeCodec handles Stripe-Signature for a given t.
func stripeCodec(h http.Header) macCodec {
	t, _, _ := strings.Cut(h.Get(handler.StripeSignatureHeader), ",")
	return macCodec{header: handler.StripeSignatureHeader, prefix: t + ",v1="}
}

type macCase struct {
	name string
	// verifier checks; signer signs with the secret verifier accepts (for
	// rotation cases, a secret other than verifier's first).
	verifier handler.Provider
	signer   handler.Signer
	codec    func(http.Header) macCodec
	header   http.Header // headers set before signing (ids)
}

func fixed(c macCodec) func(http.Header) macCodec {
	return func(http.Header) macCodec { return c }
}

func macCases() []macCase {
	const std = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	const std2 = "whsec_c2Vjb25kIHN0YW5kYXJkIHNlY3JldA=="
	stdCodec := fixed(macCodec{header: handler.StandardSignatureHeader, prefix: "v1,", base64: true})
	stdHeader := func() http.Header { return hdr(handler.StandardIDHeader, "msg_1") }
	github := fixed(macCodec{header: handler.GitHubSignatureHeader, prefix: "sha256="})
	shopify := fixed(macCodec{header: handler.ShopifyHMACHeader, base64: true})
	hmacHex := handler.HMAC{Secrets: []string{"s3cret"}, SignatureHeader: "X-Signature", Prefix: "sha256=", KeyField: "id"}
	hmacB64 := handler.HMAC{Secrets: []string{"s3cret"}, SignatureHeader: "X-Signature", Encoding: handler.Base64, KeyField: "id"}
	hmacSHA1 := handler.HMAC{Secrets: []string{"s3cret"}, SignatureHeader: "X-Signature", Hash: sha1.New, KeyField: "id"}
	hmacSHA512 := handler.HMAC{Secrets: []string{"s3cret"}, SignatureHeader: "X-Signature", Encoding: handler.Base64, Hash: sha512.New, KeyField: "id"}
	rotated := func(p handler.HMAC) *handler.HMAC {
		p.Secrets = []string{"new-secret", "s3cret"}
		return &p
	}
	return []macCase{
		{name: "stripe", verifier: &handler.Stripe{Secrets: []string{"whsec_a"}}, signer: &handler.Stripe{Secrets: []string{"whsec_a"}}, codec: stripeCodec},
		{name: "stripe rotated", verifier: &handler.Stripe{Secrets: []string{"whsec_new", "whsec_a"}}, signer: &handler.Stripe{Secrets: []string{"whsec_a"}}, codec: stripeCodec},
		{name: "standard webhooks", verifier: &handler.StandardWebhooks{Secrets: []string{std}}, signer: &handler.StandardWebhooks{Secrets: []string{std}}, codec: stdCodec, header: stdHeader()},
		{name: "standard webhooks rotated", verifier: &handler.StandardWebhooks{Secrets: []string{std2, std}}, signer: &handler.StandardWebhooks{Secrets: []string{std}}, codec: stdCodec, header: stdHeader()},
		{name: "github", verifier: &handler.GitHub{Secrets: []string{"gh"}}, signer: &handler.GitHub{Secrets: []string{"gh"}}, codec: github},
		{name: "github rotated", verifier: &handler.GitHub{Secrets: []string{"gh-new", "gh"}}, signer: &handler.GitHub{Secrets: []string{"gh"}}, codec: github},
		{name: "shopify", verifier: &handler.Shopify{Secrets: []string{"shpss"}}, signer: &handler.Shopify{Secrets: []string{"shpss"}}, codec: shopify},
		{name: "shopify rotated", verifier: &handler.Shopify{Secrets: []string{"shpss-new", "shpss"}}, signer: &handler.Shopify{Secrets: []string{"shpss"}}, codec: shopify},
		{name: "hmac hex", verifier: &hmacHex, signer: &hmacHex, codec: fixed(macCodec{header: "X-Signature", prefix: "sha256="})},
		{name: "hmac hex rotated", verifier: rotated(hmacHex), signer: &hmacHex, codec: fixed(macCodec{header: "X-Signature", prefix: "sha256="})},
		{name: "hmac base64", verifier: &hmacB64, signer: &hmacB64, codec: fixed(macCodec{header: "X-Signature", base64: true})},
		{name: "hmac sha1", verifier: &hmacSHA1, signer: &hmacSHA1, codec: fixed(macCodec{header: "X-Signature"})},
		{name: "hmac sha512", verifier: &hmacSHA512, signer: &hmacSHA512, codec: fixed(macCodec{header: "X-Signature", base64: true})},
	}
}

// TestMACComparedInFull: for every provider, a signature of the right
// length that differs from the right one in a single byte (the last byte
// above all) is rejected, and so is the right one cut short. A comparison
// of only part of the MAC lets these through; a changed body, secret or
// timestamp changes the whole MAC and cannot tell.
func TestMACComparedInFull(t *testing.T) {
	t.Parallel()
	body := []byte(`{"id":"evt_mac","type":"invoice.paid"}`)
	for _, tc := range macCases() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			now := time.Now()
			h := http.Header{}
			for k, v := range tc.header {
				h[k] = v
			}
			if err := tc.signer.Sign(h, body, now); err != nil {
				t.Fatal(err)
			}
			if err := tc.verifier.Verify(h, body, now); err != nil {
				t.Fatalf("the right signature: %v, want accepted", err)
			}
			codec := tc.codec(h)
			right := codec.get(t, h)

			try := func(what string, mac []byte) {
				t.Helper()
				bad := h.Clone()
				codec.set(bad, mac)
				if err := tc.verifier.Verify(bad, body, now); !errors.Is(err, handler.ErrSignature) {
					t.Errorf("%s: Verify = %v, want ErrSignature", what, err)
				}
			}
			last := len(right) - 1
			for i := range right {
				for _, flip := range []byte{0x01, 0x80} {
					mac := append([]byte(nil), right...)
					mac[i] ^= flip
					try(byteName(i, last)+" changed", mac)
				}
			}
			try("last byte cut", right[:last])
			try("first 8 bytes only", right[:8])
			try("one byte more", append(append([]byte(nil), right...), 0))
		})
	}
}

func byteName(i, last int) string {
	if i == last {
		return "last byte"
	}
	return fmt.Sprintf("byte %d", i)
}
