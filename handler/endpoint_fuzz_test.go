package handler_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
)

// noCommit is a database on which nothing can ever commit: every
// transaction fails to begin.
// noCommit is a database where no transaction begins; it counts the tries.
type noCommit struct{ begins *atomic.Int64 }

func (d noCommit) BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error) {
	d.begins.Add(1)
	return nil, errors.New("fuzz: no database")
}

// fuzzEndpoint is one endpoint under the fuzzer, with the provider that
// signs its deliveries.
type fuzzEndpoint struct {
	ep      *handler.Endpoint
	signer  handler.Signer
	guarded bool // the body dedupe is on: even ping and ignored need a commit
}

// FuzzEndpoint sends arbitrary requests (method, headers, body, optionally
// signed with the right secret) to an endpoint of every built-in provider
// whose processor runs on a database where nothing can commit. Without a
// database the fuzzer can check what the endpoint promises before and
// around the database: it never panics; it answers only with a status of
// its table and a JSON body; no handler ever runs (no transaction begins);
// the database is reached only through a valid signature; and no answer is 2xx
// except ping and ignored on an endpoint without the body dedupe, the two
// answers that need no commit. What needs a committing database (a 2xx for
// a processed delivery is a commit) is the other tests' job.
//
// Run it for longer with
// go test -run '^$' -fuzz FuzzEndpoint -fuzztime 30s ./handler
func FuzzEndpoint(f *testing.F) {
	var handlerRuns, begins atomic.Int64
	never := func(context.Context, pgx.Tx, txhook.Event) error {
		handlerRuns.Add(1)
		return nil
	}
	routes := txhook.NewRoutes()
	routes.Transactional("fuzz", "invoice.paid", never)
	routes.Transactional("fuzz", "push", never)
	routes.Transactional("fuzz", "orders/create", never)
	routes.Lease("fuzz", "lease", txhook.LeaseHandler{Work: func(context.Context, txhook.Claim, txhook.Event) (txhook.TxFunc, error) {
		handlerRuns.Add(1)
		return nil, nil
	}})
	proc, err := txhook.NewProcessor(noCommit{&begins}, &txhook.Config{Routes: routes, Tx: &txhook.TxOptions{MaxAttempts: 1}})
	if err != nil {
		f.Fatal(err)
	}
	now := time.Unix(1750000000, 0)
	var eps []fuzzEndpoint
	for _, p := range []interface {
		handler.Provider
		handler.Signer
	}{
		&handler.Stripe{Secrets: []string{"whsec_fuzz"}},
		&handler.GitHub{Secrets: []string{"gh_fuzz"}},
		&handler.Shopify{Secrets: []string{"shp_fuzz"}},
		&handler.StandardWebhooks{Secrets: []string{"whsec_c2VjcmV0LWZ1eno="}},
		&handler.HMAC{Secrets: []string{"hm"}, SignatureHeader: "X-Sig", KeyField: "id", TypeField: "type"},
		&handler.HMAC{Secrets: []string{"hm"}, SignatureHeader: "X-Sig", KeyHeader: "X-Id", TypeHeader: "X-Type"},
	} {
		ep, err := handler.New(proc, &handler.Config{
			Source: "fuzz", Provider: p, MaxBodyBytes: 4 << 10,
			Logger: slog.New(slog.DiscardHandler), Now: func() time.Time { return now },
		})
		if err != nil {
			f.Fatal(err)
		}
		ku, ok := p.(handler.KeyUnsigned)
		eps = append(eps, fuzzEndpoint{ep: ep, signer: p, guarded: ok && ku.KeyUnsigned()})
	}

	f.Add(uint8(0), true, "POST", "", []byte(`{"id":"evt_1","type":"invoice.paid"}`), true)
	f.Add(uint8(0), true, "POST", "", []byte(`{"id":"evt_1","type":"customer.created"}`), true)
	f.Add(uint8(0), true, "POST", "", []byte("{\"id\":\"evt_\xff\",\"type\":\"invoice.paid\"}"), true)
	f.Add(uint8(4), true, "POST", "", []byte(`{"id":"k\ud800","type":"route"}`), true)
	f.Add(uint8(1), true, "POST", "X-GitHub-Delivery: d-1\nX-GitHub-Event: push", []byte(`{"ref":"x"}`), true)
	f.Add(uint8(1), true, "POST", "X-GitHub-Delivery: d-1\nX-GitHub-Event: ping", []byte(`{"zen":"z"}`), true)
	f.Add(uint8(1), false, "POST", "X-GitHub-Delivery: d-1\nX-GitHub-Event: push\nX-Hub-Signature-256: sha256=00", []byte(`{}`), true)
	f.Add(uint8(2), true, "POST", "X-Shopify-Event-Id: e\nX-Shopify-Topic: orders/create", []byte(`{"id":1}`), false)
	f.Add(uint8(3), true, "POST", "webhook-id: msg_1", []byte(`{"type":"lease"}`), true)
	f.Add(uint8(4), true, "POST", "", []byte(`{"id":"k","type":"push"}`), true)
	f.Add(uint8(5), true, "POST", "X-Id: k\nX-Type: nothing", []byte(`{}`), false)
	f.Add(uint8(0), false, "GET", "Content-Type: application/json", []byte(nil), true)
	f.Add(uint8(1), false, "POST", "X-GitHub-Delivery: \x00\xff\nX-GitHub-Event: push", bytes.Repeat([]byte("a"), 5<<10), false)

	allowed := map[int]bool{200: true, 400: true, 405: true, 409: true, 413: true, 415: true, 500: true, 503: true}
	f.Fuzz(func(t *testing.T, which uint8, sign bool, method, rawHeader string, body []byte, declare bool) {
		fe := eps[int(which)%len(eps)]
		h := http.Header{}
		for line := range strings.Lines(rawHeader) {
			k, v, _ := strings.Cut(strings.TrimRight(line, "\r\n"), ":")
			h.Add(k, strings.TrimSpace(v))
		}
		if sign && fe.signer.Sign(h, body, now) != nil {
			sign = false // not signable as it is (a signed id header is missing)
		}
		req := &http.Request{
			Method:        method,
			URL:           &url.URL{Path: "/"},
			Proto:         "HTTP/1.1",
			ProtoMajor:    1,
			ProtoMinor:    1,
			Header:        h,
			Body:          io.NopCloser(bytes.NewReader(body)),
			ContentLength: -1,
			Host:          "fuzz",
		}
		if declare {
			req.ContentLength = int64(len(body))
		}
		req = req.WithContext(t.Context())
		before := begins.Load()
		w := httptest.NewRecorder()
		fe.ep.ServeHTTP(w, req)

		if !allowed[w.Code] {
			t.Fatalf("status %d is not in the status table", w.Code)
		}
		var answer map[string]string
		if err := json.Unmarshal(w.Body.Bytes(), &answer); err != nil {
			t.Fatalf("answer %q is not a JSON object: %v", w.Body.Bytes(), err)
		}
		if n := handlerRuns.Load(); n != 0 {
			t.Fatalf("a handler ran %d times on a database where nothing begins", n)
		}
		if begins.Load() != before && !sign {
			t.Fatal("the database was reached without a valid signature")
		}
		if w.Code/100 == 2 {
			status := answer["status"]
			if fe.guarded || (status != "ping" && status != "ignored") {
				t.Fatalf("answered %d %q without a commit (guarded: %v)", w.Code, status, fe.guarded)
			}
		}
		if w.Code == 409 && w.Header().Get("Retry-After") == "" {
			t.Fatal("in flight without Retry-After")
		}
	})
}
