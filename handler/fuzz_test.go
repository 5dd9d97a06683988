package handler

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// The fuzz targets check every header parser and key/type extraction for
// panics and bounded work. Their seed corpora (testdata/fuzz) run as part of
// the normal tests; run one for longer with, for example,
// go test -run '^$' -fuzz FuzzStripeHeader -fuzztime 30s ./handler

var fuzzNow = time.Unix(1750000000, 0)

// verifyErr fails t unless err is nil or one of the provider sentinels.
func verifyErr(t *testing.T, err error) {
	t.Helper()
	if err != nil && !errors.Is(err, ErrSignature) && !errors.Is(err, ErrTimestamp) && !errors.Is(err, ErrMalformed) {
		t.Fatalf("error %v wraps no provider sentinel", err)
	}
}

// wantSpelled fails t unless s, a key or type extracted from body, holds
// U+FFFD only where body spells it (raw or escaped): one the decoding made
// up stands for bytes that are not text, and would merge two keys.
func wantSpelled(t *testing.T, what, s string, body []byte) {
	t.Helper()
	if strings.ContainsRune(s, utf8.RuneError) && !bytes.Contains(body, []byte("\uFFFD")) &&
		!bytes.Contains(bytes.ToLower(body), []byte(`\ufffd`)) {
		t.Fatalf("%s %q holds a U+FFFD that the body %q does not spell: a lossy decoding", what, s, body)
	}
}

func checkSigs(t *testing.T, sigs [][]byte) {
	t.Helper()
	if len(sigs) > maxSignatures {
		t.Fatalf("%d signatures kept, limit %d", len(sigs), maxSignatures)
	}
	for _, s := range sigs {
		if len(s) != sha256.Size {
			t.Fatalf("signature of %d bytes kept", len(s))
		}
	}
}

func FuzzStripeHeader(f *testing.F) {
	f.Add("t=1750000000,v1=3e3e661992c26c45d9105cbea450acc1a34f8c6dbafbd891f858c6fd9054fe3e", []byte(`{"id":"evt_1","type":"a"}`))
	f.Add("t=,v1=,v0=,=,,", []byte(``))
	f.Add("t=1750000000", []byte("{\"id\":\"evt_\xff\",\"type\":\"a\"}"))
	f.Add("t=1750000000", []byte(`{"id":"evt_\ud800","type":"a"}`))
	f.Add("t=1750000000", []byte(`{"id":"evt_\ud83d\ude00","type":"a\udfff"}`))
	f.Add("t=1750000000", []byte(`{"id":"evt_\ufffd\\ud800","type":"\uD83D\uDE00"}`))
	p := &Stripe{Secrets: []string{"whsec_fuzz"}}
	f.Fuzz(func(t *testing.T, header string, body []byte) {
		tv, sigs, err := parseStripeHeader(header)
		if err == nil && tv == "" {
			t.Fatal("accepted a header without t")
		}
		checkSigs(t, sigs)
		h := http.Header{}
		h.Set(StripeSignatureHeader, header)
		verifyErr(t, p.Verify(h, body, fuzzNow))
		if d, err := p.Extract(h, body); err == nil && d.Key == "" {
			t.Fatal("extracted an empty key")
		} else if err == nil {
			wantSpelled(t, "key", d.Key, body)
			wantSpelled(t, "type", d.Type, body)
		} else {
			verifyErr(t, err)
		}
		// Whatever the body, what we sign we verify.
		if err := p.Sign(h, body, fuzzNow); err != nil {
			t.Fatal(err)
		}
		if err := p.Verify(h, body, fuzzNow); err != nil {
			t.Fatalf("signed body rejected: %v", err)
		}
	})
}

func FuzzStandardWebhooks(f *testing.F) {
	f.Add("msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", []byte(`{"test": 2432232314}`))
	f.Add("", "", "v1, v1,,  v2,abc v1,####", []byte(`{"type":7}`))
	f.Add("msg_1", "1614265330", "v1,", []byte(`{"type":"a\udc00"}`))
	f.Add("msg_1", "1614265330", "v1,", []byte("{\"type\":\"a\xfe\"}"))
	p := &StandardWebhooks{Secrets: []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}}
	f.Fuzz(func(t *testing.T, id, ts, sig string, body []byte) {
		checkSigs(t, parseStandardSignatures(sig))
		h := http.Header{}
		h.Set(StandardIDHeader, id)
		h.Set(StandardTimestampHeader, ts)
		h.Set(StandardSignatureHeader, sig)
		verifyErr(t, p.Verify(h, body, fuzzNow))
		d, err := p.Extract(h, body)
		verifyErr(t, err)
		if err == nil && d.Key != h.Get(StandardIDHeader) {
			t.Fatalf("key %q, header %q", d.Key, h.Get(StandardIDHeader))
		}
		if err == nil {
			wantSpelled(t, "type", d.Type, body)
		}
	})
}

func FuzzGitHub(f *testing.F) {
	f.Add("sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17", "72d3162e-cc78-11e3-81ab-4c9367dc0958", "push", []byte("Hello, World!"))
	f.Add("sha256=", "", "ping", []byte{})
	p := &GitHub{Secrets: []string{"It's a Secret to Everybody"}}
	f.Fuzz(func(t *testing.T, sig, delivery, event string, body []byte) {
		if s, err := parseGitHubSignature(sig); err == nil {
			checkSigs(t, [][]byte{s})
		}
		h := http.Header{}
		h.Set(GitHubSignatureHeader, sig)
		h.Set(GitHubDeliveryHeader, delivery)
		h.Set(GitHubEventHeader, event)
		verifyErr(t, p.Verify(h, body, fuzzNow))
		d, err := p.Extract(h, body)
		verifyErr(t, err)
		if err == nil && (d.Key == "" || d.Type == "" || d.Ping != (d.Type == "ping")) {
			t.Fatalf("bad delivery %+v", d)
		}
	})
}

func FuzzShopify(f *testing.F) {
	f.Add("35DGSCsYGhssCXikM1rFvRtvLrHjZ3LG9BTZ5lYDs7g=", "ev-1", "wh-1", "orders/create", []byte(`{"id":820982911946154508,"email":"jon@example.com"}`))
	f.Add("====", "", "", "", []byte{})
	p := &Shopify{Secrets: []string{"shpss_example_secret"}}
	f.Fuzz(func(t *testing.T, sig, eventID, webhookID, topic string, body []byte) {
		h := http.Header{}
		h.Set(ShopifyHMACHeader, sig)
		h.Set(ShopifyEventIDHeader, eventID)
		h.Set(ShopifyWebhookIDHeader, webhookID)
		h.Set(ShopifyTopicHeader, topic)
		verifyErr(t, p.Verify(h, body, fuzzNow))
		d, err := p.Extract(h, body)
		verifyErr(t, err)
		if err == nil && d.Key == "" {
			t.Fatal("extracted an empty key")
		}
	})
}

func FuzzHMACExtract(f *testing.F) {
	f.Add("sha256=00", `{"id":"e-1","event":"push"}`, "key-header")
	f.Add("", `{"id":{"nested":1},"event":null}`, "")
	f.Add("sha256=zz", `[1,2,3]`, "k")
	f.Add("sha256=00", "{\"id\":\"e-\xfe\",\"event\":\"push\"}", "k")
	f.Add("sha256=00", `{"id":"e-1","event":"push\ud800x"}`, "k")
	byField := &HMAC{Secrets: []string{"h"}, SignatureHeader: "X-Sig", Prefix: "sha256=", KeyField: "id", TypeField: "event"}
	byHeader := &HMAC{Secrets: []string{"h"}, SignatureHeader: "X-Sig", Encoding: Base64, KeyHeader: "X-Id", TypeField: "event"}
	f.Fuzz(func(t *testing.T, sig, body, keyHeader string) {
		h := http.Header{}
		h.Set("X-Sig", sig)
		h.Set("X-Id", keyHeader)
		for _, p := range []*HMAC{byField, byHeader} {
			verifyErr(t, p.Verify(h, []byte(body), fuzzNow))
			d, err := p.Extract(h, []byte(body))
			verifyErr(t, err)
			if err == nil && d.Key == "" {
				t.Fatal("extracted an empty key")
			}
			if err == nil && p.KeyField != "" {
				wantSpelled(t, "key", d.Key, []byte(body))
				wantSpelled(t, "type", d.Type, []byte(body))
			}
		}
	})
}

func FuzzCheckTimestamp(f *testing.F) {
	f.Add("1750000000", int64(300))
	f.Add("-1", int64(0))
	f.Add("99999999999999999999", int64(1))
	f.Add("9223372036854775807", int64(9223372036))
	f.Fuzz(func(t *testing.T, ts string, tolSeconds int64) {
		tol := time.Duration(tolSeconds%1_000_000_000) * time.Second
		v, err := checkTimestamp(ts, fuzzNow, tol)
		if err != nil {
			verifyErr(t, err)
			return
		}
		if tol <= 0 {
			tol = DefaultTolerance
		}
		d := fuzzNow.Unix() - v
		if d > int64(tol/time.Second) || -d > int64(tol/time.Second) {
			t.Fatalf("accepted %d, %d s from now, tolerance %v", v, d, tol)
		}
	})
}
