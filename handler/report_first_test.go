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

// TestReportBeforeAnswer: the delivery is reported before its answer is
// complete, so whoever holds the answer finds the delivery observed. While
// the observer holds the report, no answer arrives; once it lets go, the
// answer does.
func TestReportBeforeAnswer(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	proc, err := txhook.NewProcessor(d.Pool, fallbackOnly("stripe"))
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
	released := false
	release := func() {
		if !released {
			released = true
			close(obs.release)
		}
	}
	defer release() // before srv.Close, which waits for the handler

	body := stripeEvent("evt_report_first", "invoice.paid")
	h := http.Header{}
	if err := p.Sign(h, []byte(body), now); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		status int
		body   string
		err    error
	}
	answers := make(chan answer, 1)
	go func() {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, strings.NewReader(body))
		if err != nil {
			answers <- answer{err: err}
			return
		}
		req.Header = h
		resp, err := srv.Client().Do(req)
		if err != nil {
			answers <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		answers <- answer{resp.StatusCode, string(raw), err}
	}()

	select {
	case r := <-obs.got:
		if r.Answer != handler.AnswerProcessed {
			t.Errorf("reported %v, want processed", r.Answer)
		}
	case a := <-answers:
		t.Fatalf("answer %d %q (%v) arrived before the delivery was reported", a.status, a.body, a.err)
	case <-time.After(waitBound):
		t.Fatal("no report of the delivery")
	}
	// Held: a correct endpoint never answers meanwhile, however long the
	// wait; a short one catches an answer sent ahead of its report.
	select {
	case a := <-answers:
		t.Fatalf("answer %d %q arrived while its report was held", a.status, a.body)
	case <-time.After(200 * time.Millisecond):
	}
	release()
	select {
	case a := <-answers:
		if a.err != nil || a.status != http.StatusOK || !strings.Contains(a.body, `"processed"`) {
			t.Errorf("answer %d %q, %v; want 200 processed", a.status, a.body, a.err)
		}
	case <-time.After(waitBound):
		t.Error("no answer once the report was let go")
	}
}
