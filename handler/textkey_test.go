package handler_test

import (
	"errors"
	"testing"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
)

// TestBodyKeysMustBeText: an event key (or type) read from a signed JSON
// body must be the text the sender wrote. Raw bytes that are not UTF-8 and
// escaped surrogates that are not half of a pair decode to U+FFFD, which
// would make evt_\xff and evt_\xfe one key and answer the second event a
// duplicate of the first: each is refused with 400, nothing written, as an
// invalid key header is; a NUL is refused too. A valid escaped pair and
// other escapes are the text they spell, and processed.
func TestBodyKeysMustBeText(t *testing.T) {
	t.Parallel()
	providers := []struct {
		name string
		p    interface {
			handler.Provider
			handler.Signer
		}
	}{
		{"stripe", &handler.Stripe{Secrets: []string{stripeSecret}}},
		{"hmac", &handler.HMAC{Secrets: []string{"hm"}, SignatureHeader: "X-Sig", KeyField: "id", TypeField: "type"}},
	}
	refused := []struct{ name, body string }{
		{`raw \xff`, "{\"id\":\"evt_\xff\",\"type\":\"invoice.paid\"}"},
		{`raw \xfe`, "{\"id\":\"evt_\xfe\",\"type\":\"invoice.paid\"}"},
		{`raw \xc3 cut`, "{\"id\":\"evt_\xc3\",\"type\":\"invoice.paid\"}"},
		{`escaped lone first half`, `{"id":"evt_\ud800","type":"invoice.paid"}`},
		{`escaped lone second half`, `{"id":"evt_\udfff","type":"invoice.paid"}`},
		{`escaped halves reversed`, `{"id":"evt_\ude00\ud83d","type":"invoice.paid"}`},
		{`escaped first half then a letter`, `{"id":"evt_\uD800\u0041","type":"invoice.paid"}`},
		{`escaped NUL`, `{"id":"evt_\u0000","type":"invoice.paid"}`},
		{`type raw \xff`, "{\"id\":\"evt_type_ff\",\"type\":\"invoice.paid\xff\"}"},
		{`type escaped lone half`, `{"id":"evt_type_d800","type":"invoice.paid\ud800"}`},
	}
	for _, pr := range providers {
		t.Run(pr.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, handler.Config{Source: pr.name, Provider: pr.p}, nil)
			for _, c := range refused {
				e.post(pr.p, c.body).want(t, 400, "error", "bad_request")
				if r := e.reps.last(t); c.name != "escaped NUL" && !errors.Is(r.Err, txhook.ErrNotText) {
					t.Errorf("%s: refused for %v, want txhook.ErrNotText", c.name, r.Err)
				}
				e.wantCounts(0, 0)
			}
			e.post(pr.p, `{"id":"evt_\ud83d\ude00 \u00e9\"\\\/","type":"invoice.paid"}`).want(t, 200, "status", "processed")
			e.post(pr.p, "{\"id\":\"evt_\U0001F600 \u00e9\\\"\\\\/\",\"type\":\"invoice.paid\"}").want(t, 200, "status", "duplicate")
			if r := e.reps.last(t); r.Key != "evt_\U0001F600 \u00e9\"\\/" {
				t.Errorf("key = %q, want the text the escapes spell", r.Key)
			}
			e.wantCounts(1, 1)
		})
	}
}
