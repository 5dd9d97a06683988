// Package providers cross-checks the handler package's signature schemes
// against official provider code. It lives in the tests module so that the
// SDKs it imports never become dependencies of the library.
package providers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stripe/stripe-go/v82/webhook"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

var bodies = []string{
	`{"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","object":"event","api_version":"2025-03-31.basil","type":"invoice.paid","data":{"object":{"id":"in_1","amount_paid":4200}}}`,
	`{"id":"evt_unicode","object":"event","type":"customer.updated","data":{"object":{"name":"Zoë \u00e9\u4e16"}}}`,
	"{\n  \"id\": \"evt_pretty\",\n  \"object\": \"event\",\n  \"type\": \"charge.succeeded\"\n}\n",
}

var secrets = []string{"whsec_test_0123456789abcdef", "whsec_" + strings.Repeat("Z", 64), "plain-secret"}

// TestStripeGoSignsWeVerify: payloads signed by stripe-go's own test helper
// verify with our Stripe provider, and fail once tampered with.
func TestStripeGoSignsWeVerify(t *testing.T) {
	t.Parallel()
	ts := time.Unix(1750000000, 0)
	for _, secret := range secrets {
		for _, body := range bodies {
			signed := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{
				Payload: []byte(body), Secret: secret, Timestamp: ts,
			})
			p := &handler.Stripe{Secrets: []string{secret}}
			h := http.Header{}
			h.Set(handler.StripeSignatureHeader, signed.Header)
			if err := p.Verify(h, signed.Payload, ts.Add(time.Minute)); err != nil {
				t.Errorf("secret %q: stripe-go's signature rejected: %v", secret, err)
			}
			if err := p.Verify(h, append([]byte(body), ' '), ts); !errors.Is(err, handler.ErrSignature) {
				t.Errorf("secret %q: tampered body: %v, want ErrSignature", secret, err)
			}
			if err := p.Verify(h, signed.Payload, ts.Add(301*time.Second)); !errors.Is(err, handler.ErrTimestamp) {
				t.Errorf("secret %q: stale: %v, want ErrTimestamp", secret, err)
			}
			other := &handler.Stripe{Secrets: []string{secret + "x"}}
			if err := other.Verify(h, signed.Payload, ts); !errors.Is(err, handler.ErrSignature) {
				t.Errorf("secret %q: wrong secret: %v, want ErrSignature", secret, err)
			}
		}
	}
}

// TestWeSignStripeGoVerifies: our signatures pass stripe-go's
// ValidatePayload and ConstructEvent, which read the same id and type.
func TestWeSignStripeGoVerifies(t *testing.T) {
	t.Parallel()
	for _, secret := range secrets {
		for _, body := range bodies {
			p := &handler.Stripe{Secrets: []string{secret}}
			h := http.Header{}
			// stripe-go checks the timestamp against the real clock.
			if err := p.Sign(h, []byte(body), time.Now()); err != nil {
				t.Fatal(err)
			}
			sig := h.Get(handler.StripeSignatureHeader)
			if err := webhook.ValidatePayload([]byte(body), sig, secret); err != nil {
				t.Errorf("secret %q: stripe-go rejects our signature: %v", secret, err)
				continue
			}
			if err := webhook.ValidatePayload([]byte(body+" "), sig, secret); !errors.Is(err, webhook.ErrNoValidSignature) {
				t.Errorf("secret %q: stripe-go accepts a tampered body: %v", secret, err)
			}
			ev, err := webhook.ConstructEventWithOptions([]byte(body), sig, secret,
				webhook.ConstructEventOptions{IgnoreAPIVersionMismatch: true})
			if err != nil {
				t.Errorf("ConstructEvent: %v", err)
				continue
			}
			d, err := p.Extract(h, []byte(body))
			if err != nil || d.Key != ev.ID || d.Type != string(ev.Type) {
				t.Errorf("we extract %+v (%v), stripe-go reads id %q type %q", d, err, ev.ID, ev.Type)
			}
		}
	}
}

// TestRotationAgainstStripeGo: during a secret roll Stripe signs with both
// secrets; a header carrying both signatures verifies with either.
func TestRotationAgainstStripeGo(t *testing.T) {
	t.Parallel()
	ts := time.Now()
	body := []byte(bodies[0])
	oldSig := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: "whsec_old", Timestamp: ts})
	newSig := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: body, Secret: "whsec_new", Timestamp: ts})
	header := fmt.Sprintf("t=%d,v1=%x,v1=%x", ts.Unix(), oldSig.Signature, newSig.Signature)
	h := http.Header{}
	h.Set(handler.StripeSignatureHeader, header)
	for _, secrets := range [][]string{{"whsec_old"}, {"whsec_new"}, {"whsec_other", "whsec_new"}} {
		if err := (&handler.Stripe{Secrets: secrets}).Verify(h, body, ts); err != nil {
			t.Errorf("secrets %v: %v", secrets, err)
		}
		if err := webhook.ValidatePayload(body, header, secrets[len(secrets)-1]); err != nil {
			t.Errorf("stripe-go, secret %v: %v", secrets, err)
		}
	}
}

// TestStripeGoPayloadThroughEndpoint sends a stripe-go-signed delivery
// through an Endpoint on a real server and PostgreSQL.
func TestStripeGoPayloadThroughEndpoint(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	if _, err := d.Pool.Exec(t.Context(), `CREATE TABLE paid (event_key text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	routes := txhook.NewRoutes()
	routes.Transactional("stripe", "invoice.paid", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO paid (event_key) VALUES ($1)`, ev.Key)
		return err
	})
	proc, err := txhook.NewProcessor(d.Pool, &txhook.Config{Routes: routes})
	if err != nil {
		t.Fatal(err)
	}
	const secret = "whsec_endpoint"
	ep, err := handler.New(proc, &handler.Config{
		Source:   "stripe",
		Provider: &handler.Stripe{Secrets: []string{secret}},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(ep)
	defer srv.Close()

	send := func(secret string) (int, string) {
		signed := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: []byte(bodies[0]), Secret: secret})
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, strings.NewReader(bodies[0]))
		req.Header.Set("Stripe-Signature", signed.Header)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var m map[string]string
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatalf("body %q: %v", raw, err)
		}
		return resp.StatusCode, m["status"] + m["error"]
	}
	for _, step := range []struct {
		secret string
		status int
		answer string
		rows   int
	}{
		{"whsec_wrong", 400, "bad_signature", 0},
		{secret, 200, "processed", 1},
		{secret, 200, "duplicate", 1},
	} {
		status, answer := send(step.secret)
		var rows int
		if err := d.Pool.QueryRow(t.Context(), `SELECT count(*) FROM paid`).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		if status != step.status || answer != step.answer || rows != step.rows {
			t.Errorf("secret %q: %d %s, %d rows; want %d %s, %d rows", step.secret, status, answer, rows, step.status, step.answer, step.rows)
		}
	}
}
