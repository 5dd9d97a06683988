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

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/internal/testdb"
)

// blockingObserver holds every report until release is closed.
type blockingObserver struct {
	got     chan handler.Report
	release chan struct{}
}

func (o *blockingObserver) ObserveDelivery(_ context.Context, r handler.Report) {
	o.got <- r
	<-o.release
}

// TestAnswerSentBeforeReport: the sender has its answer, whole, while the
// delivery's report (log line and observer) is still being made: a slow log
// sink or observer does not hold a committed event's 2xx back.
func TestAnswerSentBeforeReport(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	proc, err := txhook.NewProcessor(d.Pool, &txhook.Config{Routes: routesFor("stripe", map[string]txhook.HandlerFunc{"": record})})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Pool.Exec(t.Context(), `CREATE TABLE effects (
		source text NOT NULL, event_key text NOT NULL, event_type text NOT NULL,
		UNIQUE (source, event_key))`); err != nil {
		t.Fatal(err)
	}
	obs := &blockingObserver{got: make(chan handler.Report, 1), release: make(chan struct{})}
	p := &handler.Stripe{Secrets: []string{stripeSecret}}
	ep, err := handler.New(proc, &handler.Config{
		Source: "stripe", Provider: p, Observer: obs,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Now:    func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(ep)
	defer srv.Close()
	defer close(obs.release) // before srv.Close, which waits for the handler

	body := stripeEvent("evt_answer_first", "invoice.paid")
	h := http.Header{}
	if err := p.Sign(h, []byte(body), now); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), waitBound)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = h
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("no answer while the report is held: %v", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("answer's body not whole while the report is held: %v", err)
	}
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(raw), `"processed"`) {
		t.Errorf("answer %d %q, want 200 processed", resp.StatusCode, raw)
	}
	if resp.ContentLength != int64(len(raw)) || len(resp.TransferEncoding) > 0 {
		t.Errorf("answer framed with Content-Length %d, Transfer-Encoding %v for a body of %d bytes; want its length, not chunked",
			resp.ContentLength, resp.TransferEncoding, len(raw))
	}
	select {
	case r := <-obs.got:
		if r.Answer != handler.AnswerProcessed {
			t.Errorf("reported %v, want processed", r.Answer)
		}
	case <-time.After(waitBound):
		t.Error("no report of the delivery")
	}
}
