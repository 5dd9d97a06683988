package handler_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
)

// BenchmarkEndpointOverhead measures the endpoint's own work for one
// delivery (body read, signature check, key extraction, routing, the answer
// and the log record): its type has no route, so no database is reached.
func BenchmarkEndpointOverhead(b *testing.B) {
	p := &handler.Stripe{Secrets: []string{stripeSecret}}
	rs := txhook.NewRoutes()
	rs.Transactional("stripe", "other.type", func(context.Context, pgx.Tx, txhook.Event) error { return nil })
	proc, err := txhook.NewProcessor(noDB{}, &txhook.Config{Routes: rs})
	if err != nil {
		b.Fatal(err)
	}
	ep, err := handler.New(proc, &handler.Config{
		Source:   "stripe",
		Provider: p,
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		b.Fatal(err)
	}
	body := stripeEvent("evt_bench", "invoice.paid")
	header := http.Header{}
	if err := p.Sign(header, []byte(body), time.Now()); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
		req.Header = header
		w := httptest.NewRecorder()
		ep.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
}

// noDB is a Beginner for routes that never open a transaction.
type noDB struct{}

func (noDB) BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error) {
	return nil, context.Canceled
}
