package handler_test

import (
	"crypto/sha1"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/txhook/txhook/handler"
)

// The vectors below come from the providers' published documents, or were
// computed with openssl from the documented algorithm (independently of
// this package's code):
//
//	printf '1700000000.<body>' | openssl dgst -sha256 -hmac whsec_test_secret
//	printf '<body>' | openssl dgst -sha256 -hmac shpss_example_secret -binary | base64

type verifyCase struct {
	name    string
	header  http.Header
	body    string
	now     time.Time
	wantErr error // nil: accepted
}

func runVerify(t *testing.T, p handler.Provider, cases []verifyCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := p.Verify(tc.header, []byte(tc.body), tc.now)
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatalf("Verify: %v, want accepted", err)
			case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
				t.Fatalf("Verify: %v, want %v", err, tc.wantErr)
			}
		})
	}
}

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

const (
	stripeBody = `{"id":"evt_test_1","object":"event","type":"invoice.paid"}`
	stripeSig  = "3e3e661992c26c45d9105cbea450acc1a34f8c6dbafbd891f858c6fd9054fe3e"
)

var stripeT = time.Unix(1700000000, 0)

func TestStripeVerify(t *testing.T) {
	t.Parallel()
	p := &handler.Stripe{Secrets: []string{"whsec_test_secret"}}
	rotated := &handler.Stripe{Secrets: []string{"whsec_new", "whsec_test_secret"}}
	good := "t=1700000000,v1=" + stripeSig
	runVerify(t, p, []verifyCase{
		{"vector", hdr("Stripe-Signature", good), stripeBody, stripeT, nil},
		{"within tolerance", hdr("Stripe-Signature", good), stripeBody, stripeT.Add(299 * time.Second), nil},
		{"several v1, one valid", hdr("Stripe-Signature", "t=1700000000,v1=00ff,v1="+stripeSig+",v0=abc"), stripeBody, stripeT, nil},
		{"stale", hdr("Stripe-Signature", good), stripeBody, stripeT.Add(301 * time.Second), handler.ErrTimestamp},
		{"future", hdr("Stripe-Signature", good), stripeBody, stripeT.Add(-301 * time.Second), handler.ErrTimestamp},
		{"tampered body", hdr("Stripe-Signature", good), stripeBody + " ", stripeT, handler.ErrSignature},
		{"tampered t", hdr("Stripe-Signature", "t=1700000001,v1="+stripeSig), stripeBody, stripeT, handler.ErrSignature},
		{"missing header", hdr(), stripeBody, stripeT, handler.ErrSignature},
		{"no t", hdr("Stripe-Signature", "v1="+stripeSig), stripeBody, stripeT, handler.ErrTimestamp},
		{"bad t", hdr("Stripe-Signature", "t=abc,v1="+stripeSig), stripeBody, stripeT, handler.ErrTimestamp},
		{"no v1", hdr("Stripe-Signature", "t=1700000000,v0="+stripeSig), stripeBody, stripeT, handler.ErrSignature},
		{"garbage", hdr("Stripe-Signature", "nonsense"), stripeBody, stripeT, handler.ErrSignature},
	})
	runVerify(t, rotated, []verifyCase{
		{"rotation: old secret still accepted", hdr("Stripe-Signature", good), stripeBody, stripeT, nil},
	})
	runVerify(t, &handler.Stripe{Secrets: []string{"whsec_other"}}, []verifyCase{
		{"wrong secret", hdr("Stripe-Signature", good), stripeBody, stripeT, handler.ErrSignature},
	})
	runVerify(t, &handler.Stripe{Secrets: []string{"whsec_test_secret"}, Tolerance: time.Hour}, []verifyCase{
		{"custom tolerance", hdr("Stripe-Signature", good), stripeBody, stripeT.Add(59 * time.Minute), nil},
	})
}

func TestStripeExtract(t *testing.T) {
	t.Parallel()
	p := &handler.Stripe{Secrets: []string{"s"}}
	d, err := p.Extract(nil, []byte(stripeBody))
	if err != nil || d.Key != "evt_test_1" || d.Type != "invoice.paid" || d.Ping {
		t.Fatalf("Extract = %+v, %v", d, err)
	}
	for _, body := range []string{``, `[]`, `{"type":"x"}`, `{"id":7}`, `{"id":"evt_1"`} {
		if _, err := p.Extract(nil, []byte(body)); !errors.Is(err, handler.ErrMalformed) {
			t.Errorf("Extract(%q): %v, want ErrMalformed", body, err)
		}
	}
}

func TestGitHubVerify(t *testing.T) {
	t.Parallel()
	// GitHub's documented example: secret "It's a Secret to Everybody",
	// payload "Hello, World!".
	const sig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
	p := &handler.GitHub{Secrets: []string{"It's a Secret to Everybody"}}
	runVerify(t, p, []verifyCase{
		{"documented vector", hdr("X-Hub-Signature-256", sig), "Hello, World!", time.Time{}, nil},
		{"tampered", hdr("X-Hub-Signature-256", sig), "Hello, World?", time.Time{}, handler.ErrSignature},
		{"missing", hdr(), "Hello, World!", time.Time{}, handler.ErrSignature},
		{"sha1 header only", hdr("X-Hub-Signature", "sha1=01"), "Hello, World!", time.Time{}, handler.ErrSignature},
		{"no prefix", hdr("X-Hub-Signature-256", sig[len("sha256="):]), "Hello, World!", time.Time{}, handler.ErrSignature},
		{"truncated", hdr("X-Hub-Signature-256", sig[:40]), "Hello, World!", time.Time{}, handler.ErrSignature},
		{"not hex", hdr("X-Hub-Signature-256", "sha256=zz"), "Hello, World!", time.Time{}, handler.ErrSignature},
	})
	runVerify(t, &handler.GitHub{Secrets: []string{"new", "It's a Secret to Everybody"}}, []verifyCase{
		{"rotation", hdr("X-Hub-Signature-256", sig), "Hello, World!", time.Time{}, nil},
	})
}

func TestGitHubExtract(t *testing.T) {
	t.Parallel()
	p := &handler.GitHub{Secrets: []string{"s"}}
	d, err := p.Extract(hdr("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958", "X-GitHub-Event", "push"), nil)
	if err != nil || d.Key != "72d3162e-cc78-11e3-81ab-4c9367dc0958" || d.Type != "push" || d.Ping {
		t.Fatalf("Extract = %+v, %v", d, err)
	}
	d, err = p.Extract(hdr("X-GitHub-Delivery", "d1", "X-GitHub-Event", "ping"), nil)
	if err != nil || !d.Ping {
		t.Fatalf("ping: Extract = %+v, %v", d, err)
	}
	for _, h := range []http.Header{hdr("X-GitHub-Event", "push"), hdr("X-GitHub-Delivery", "d1")} {
		if _, err := p.Extract(h, nil); !errors.Is(err, handler.ErrMalformed) {
			t.Errorf("Extract(%v): %v, want ErrMalformed", h, err)
		}
	}
}

func TestStandardWebhooksVerify(t *testing.T) {
	t.Parallel()
	// The Standard Webhooks specification's test vector.
	const (
		secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
		id     = "msg_p5jXN8AQM9LWM0D4loKWxJek"
		ts     = "1614265330"
		body   = `{"test": 2432232314}`
		sig    = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	)
	now := time.Unix(1614265330, 0)
	p := &handler.StandardWebhooks{Secrets: []string{secret}}
	std := func(id, ts, sig string) http.Header {
		return hdr("webhook-id", id, "webhook-timestamp", ts, "webhook-signature", sig)
	}
	runVerify(t, p, []verifyCase{
		{"spec vector", std(id, ts, sig), body, now, nil},
		{"svix headers", hdr("svix-id", id, "svix-timestamp", ts, "svix-signature", sig), body, now, nil},
		{"several signatures", std(id, ts, "v1a,abc v1,AAAA "+sig), body, now, nil},
		{"within tolerance", std(id, ts, sig), body, now.Add(5 * time.Minute), nil},
		{"stale", std(id, ts, sig), body, now.Add(5*time.Minute + time.Second), handler.ErrTimestamp},
		{"future", std(id, ts, sig), body, now.Add(-5*time.Minute - time.Second), handler.ErrTimestamp},
		{"other id", std("msg_other", ts, sig), body, now, handler.ErrSignature},
		{"tampered body", std(id, ts, sig), `{"test": 2432232315}`, now, handler.ErrSignature},
		{"missing id", std("", ts, sig), body, now, handler.ErrSignature},
		{"missing timestamp", std(id, "", sig), body, now, handler.ErrTimestamp},
		{"bad timestamp", std(id, "1614265330.5", sig), body, now, handler.ErrTimestamp},
		{"missing signature", std(id, ts, ""), body, now, handler.ErrSignature},
		{"other version only", std(id, ts, "v2,"+sig[3:]), body, now, handler.ErrSignature},
	})
	runVerify(t, &handler.StandardWebhooks{Secrets: []string{"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}}, []verifyCase{
		{"secret without prefix", std(id, ts, sig), body, now, nil},
	})
	runVerify(t, &handler.StandardWebhooks{Secrets: []string{"whsec_c2VjcmV0", secret}}, []verifyCase{
		{"rotation", std(id, ts, sig), body, now, nil},
	})
	if err := (&handler.StandardWebhooks{Secrets: []string{"whsec_!!!"}}).Validate(); !errors.Is(err, handler.ErrNoSecret) {
		t.Errorf("Validate(bad base64) = %v, want ErrNoSecret", err)
	}
	d, err := p.Extract(std(id, ts, sig), []byte(`{"type":"invoice.paid","data":{}}`))
	if err != nil || d.Key != id || d.Type != "invoice.paid" {
		t.Errorf("Extract = %+v, %v", d, err)
	}
	d, err = p.Extract(std(id, ts, sig), []byte(body))
	if err != nil || d.Key != id || d.Type != "" {
		t.Errorf("Extract(no type) = %+v, %v", d, err)
	}
}

func TestShopifyVerify(t *testing.T) {
	t.Parallel()
	const (
		body = `{"id":820982911946154508,"email":"jon@example.com"}`
		sig  = "35DGSCsYGhssCXikM1rFvRtvLrHjZ3LG9BTZ5lYDs7g="
	)
	p := &handler.Shopify{Secrets: []string{"shpss_example_secret"}}
	runVerify(t, p, []verifyCase{
		{"vector", hdr("X-Shopify-Hmac-Sha256", sig), body, time.Time{}, nil},
		{"tampered", hdr("X-Shopify-Hmac-Sha256", sig), body + "\n", time.Time{}, handler.ErrSignature},
		{"missing", hdr(), body, time.Time{}, handler.ErrSignature},
		{"hex instead of base64", hdr("X-Shopify-Hmac-Sha256", "dfd0c6482b181a1b2c0978a4335ac5bd1b6f2eb1e36772c6f414d9e65603b3b8"), body, time.Time{}, handler.ErrSignature},
	})
	runVerify(t, &handler.Shopify{Secrets: []string{"other", "shpss_example_secret"}}, []verifyCase{
		{"rotation", hdr("X-Shopify-Hmac-Sha256", sig), body, time.Time{}, nil},
	})
	d, err := p.Extract(hdr("X-Shopify-Event-Id", "ev-1", "X-Shopify-Webhook-Id", "wh-1", "X-Shopify-Topic", "orders/create"), nil)
	if err != nil || d.Key != "ev-1" || d.Type != "orders/create" {
		t.Errorf("Extract = %+v, %v", d, err)
	}
	d, err = p.Extract(hdr("X-Shopify-Webhook-Id", "wh-1", "X-Shopify-Topic", "orders/create"), nil)
	if err != nil || d.Key != "wh-1" {
		t.Errorf("Extract(fallback) = %+v, %v", d, err)
	}
	if _, err := p.Extract(hdr("X-Shopify-Topic", "orders/create"), nil); !errors.Is(err, handler.ErrMalformed) {
		t.Errorf("Extract(no id) = %v, want ErrMalformed", err)
	}
}

func TestHMACProvider(t *testing.T) {
	t.Parallel()
	const body = `{"event":"order.created","id":"ord_evt_9"}`
	// printf '<body>' | openssl dgst -sha1 -hmac generic -binary | base64
	p := &handler.HMAC{
		Secrets:         []string{"generic"},
		SignatureHeader: "X-Signature",
		Prefix:          "sha1=",
		Encoding:        handler.Base64,
		Hash:            sha1.New,
		KeyField:        "id",
		TypeField:       "event",
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	runVerify(t, p, []verifyCase{
		{"vector", hdr("X-Signature", "sha1=EEiWfodpNTTX9rt2nbRo1glNlbU="), body, time.Time{}, nil},
		{"no prefix", hdr("X-Signature", "EEiWfodpNTTX9rt2nbRo1glNlbU="), body, time.Time{}, handler.ErrSignature},
		{"tampered", hdr("X-Signature", "sha1=EEiWfodpNTTX9rt2nbRo1glNlbU="), body + " ", time.Time{}, handler.ErrSignature},
		{"missing", hdr(), body, time.Time{}, handler.ErrSignature},
	})
	d, err := p.Extract(nil, []byte(body))
	if err != nil || d.Key != "ord_evt_9" || d.Type != "order.created" {
		t.Errorf("Extract = %+v, %v", d, err)
	}
	if p.KeyUnsigned() {
		t.Error("KeyUnsigned with KeyField = true, want false")
	}

	hp := &handler.HMAC{Secrets: []string{"k"}, SignatureHeader: "X-Sig", KeyHeader: "X-Id", TypeHeader: "X-Type"}
	h := hdr("X-Id", "abc", "X-Type", "t1")
	if err := hp.Sign(h, []byte("payload"), time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := hp.Verify(h, []byte("payload"), time.Time{}); err != nil {
		t.Errorf("hex round trip: %v", err)
	}
	d, err = hp.Extract(h, []byte("not json"))
	if err != nil || d.Key != "abc" || d.Type != "t1" || !hp.KeyUnsigned() {
		t.Errorf("Extract(headers) = %+v, %v", d, err)
	}
	if _, err := hp.Extract(hdr(), nil); !errors.Is(err, handler.ErrMalformed) {
		t.Errorf("Extract(no key header) = %v, want ErrMalformed", err)
	}

	for _, bad := range []*handler.HMAC{
		{SignatureHeader: "X", KeyHeader: "K"},
		{Secrets: []string{"s"}, KeyHeader: "K"},
		{Secrets: []string{"s"}, SignatureHeader: "X"},
		{Secrets: []string{"s"}, SignatureHeader: "X", KeyHeader: "K", KeyField: "id"},
		{Secrets: []string{"s"}, SignatureHeader: "X", KeyHeader: "K", Encoding: 7},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want error", bad)
		}
	}
}

// TestSignRoundTrip checks that each built-in Signer produces what its
// Verify accepts, and that none signs without a secret.
func TestSignRoundTrip(t *testing.T) {
	t.Parallel()
	now := time.Unix(1750000000, 0)
	body := []byte(`{"id":"evt_rt","type":"x.y"}`)
	for name, p := range map[string]interface {
		handler.Provider
		handler.Signer
	}{
		"stripe":   &handler.Stripe{Secrets: []string{"whsec_a"}},
		"github":   &handler.GitHub{Secrets: []string{"a"}},
		"standard": &handler.StandardWebhooks{Secrets: []string{"whsec_YWJjZA=="}},
		"shopify":  &handler.Shopify{Secrets: []string{"a"}},
	} {
		h := hdr("webhook-id", "msg_rt")
		if err := p.Sign(h, body, now); err != nil {
			t.Fatalf("%s: Sign: %v", name, err)
		}
		if err := p.Verify(h, body, now); err != nil {
			t.Errorf("%s: Verify(signed) = %v", name, err)
		}
		if err := p.Verify(h, append(body, ' '), now); !errors.Is(err, handler.ErrSignature) {
			t.Errorf("%s: Verify(tampered) = %v, want ErrSignature", name, err)
		}
	}
	for _, p := range []handler.Signer{&handler.Stripe{}, &handler.GitHub{}, &handler.StandardWebhooks{}, &handler.Shopify{}} {
		if err := p.Sign(http.Header{}, body, now); !errors.Is(err, handler.ErrNoSecret) {
			t.Errorf("%T.Sign without secret = %v, want ErrNoSecret", p, err)
		}
	}
}

// TestKeyUnsignedPerProvider: every built-in provider whose key or type is
// read from an unsigned header reports so, turning the body dedupe on by
// default; those that sign both do not.
func TestKeyUnsignedPerProvider(t *testing.T) {
	for _, tc := range []struct {
		p    handler.Provider
		want bool
	}{
		{&handler.GitHub{}, true},  // X-GitHub-Delivery, X-GitHub-Event
		{&handler.Shopify{}, true}, // X-Shopify-Event-Id, X-Shopify-Topic
		{&handler.Stripe{}, false}, // id and type in the signed body
		{&handler.StandardWebhooks{}, false},
		{&handler.HMAC{KeyField: "id"}, false},
		{&handler.HMAC{KeyField: "id", TypeField: "type"}, false},
		{&handler.HMAC{KeyField: "id", TypeHeader: "X-Type"}, true},
		{&handler.HMAC{KeyHeader: "X-Id", TypeField: "type"}, true},
	} {
		ku, ok := tc.p.(handler.KeyUnsigned)
		if got := ok && ku.KeyUnsigned(); got != tc.want {
			t.Errorf("%T %+v: unsigned key or type = %v, want %v", tc.p, tc.p, got, tc.want)
		}
	}
}
