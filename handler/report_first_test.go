package handler_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/handler"
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
	obs := &blockingObserver{got: make(chan handler.Report, 1), release: make(chan struct{})}
	p := &handler.Stripe{Secrets: []string{stripeSecret}}
	e := newEnv(t, handler.Config{Source: "stripe", Provider: p, Observer: obs}, fallbackOnly("stripe"))
	released := false
	release := func() {
		if !released {
			released = true
			close(obs.release)
		}
	}
	defer release() // before the server's cleanup, which waits for the handler

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
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, e.srv.URL, strings.NewReader(body))
		if err != nil {
			answers <- answer{err: err}
			return
		}
		req.Header = h
		resp, err := e.srv.Client().Do(req)
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
