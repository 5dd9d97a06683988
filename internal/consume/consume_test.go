package consume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/internal/clip"
)

func TestDecide(t *testing.T) {
	b := Backoff{Base: time.Second, Max: time.Minute}
	handlerErr := errors.New("boom")
	for _, c := range []struct {
		name   string
		res    txhook.Result
		err    error
		action Action
		answer handler.Answer
	}{
		{"processed", txhook.Result{Outcome: txhook.OutcomeProcessed}, nil, Ack, handler.AnswerProcessed},
		{"duplicate", txhook.Result{Outcome: txhook.OutcomeDuplicate}, nil, Ack, handler.AnswerDuplicate},
		{"failed", txhook.Result{Outcome: txhook.OutcomeFailed, Err: handlerErr}, nil, Ack, handler.AnswerFailed},
		{"ignored", txhook.Result{Outcome: txhook.OutcomeIgnored}, nil, Ack, handler.AnswerIgnored},
		{"queued", txhook.Result{Outcome: txhook.OutcomeQueued}, nil, Ack, handler.AnswerQueued},
		{"in flight", txhook.Result{Outcome: txhook.OutcomeInFlight, RetryAfter: 3 * time.Second}, nil, Retry, handler.AnswerInFlight},
		{"zero outcome", txhook.Result{}, nil, Retry, handler.AnswerError},
		{"handler error", txhook.Result{}, handlerErr, Retry, handler.AnswerError},
		{"unavailable", txhook.Result{}, &txhook.UnavailableError{Err: handlerErr}, Retry, handler.AnswerUnavailable},
		{"commit unknown", txhook.Result{}, fmt.Errorf("x: %w", &txhook.CommitUnknownError{Err: handlerErr}), Retry, handler.AnswerUnavailable},
		{"invalid key", txhook.Result{}, &txhook.ValidationError{Field: "key", Err: txhook.ErrEmpty}, Reject, handler.AnswerBadRequest},
	} {
		d := Decide(c.res, c.err, 1, b)
		if d.Action != c.action || d.Answer != c.answer {
			t.Errorf("%s: %v %s, want %v %s", c.name, d.Action, d.Answer, c.action, c.answer)
		}
		if d.Action == Retry && d.Delay <= 0 {
			t.Errorf("%s: retry without a delay", c.name)
		}
	}
	if d := Decide(txhook.Result{Outcome: txhook.OutcomeInFlight, RetryAfter: 3 * time.Second}, nil, 1, b); d.Delay != 3*time.Second {
		t.Errorf("in flight waits %v, want the Retry-After 3s", d.Delay)
	}
}

func TestBackoffGrowsToItsMax(t *testing.T) {
	b := Backoff{Base: 100 * time.Millisecond, Max: time.Second}
	for attempt, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 400 * time.Millisecond, 10: time.Second, 1000: time.Second} {
		for range 50 {
			d := b.Delay(attempt)
			if d < want*3/4 || d > want*5/4 {
				t.Fatalf("attempt %d: delay %v outside %v ± 25%%", attempt, d, want)
			}
		}
	}
	if d := (Backoff{}).Delay(1); d < 750*time.Millisecond || d > 1250*time.Millisecond {
		t.Errorf("zero Backoff's first delay %v, want DefaultBackoff's 1s ± 25%%", d)
	}
}

// A message may carry an id of any length: its report keeps at most
// clip.Max bytes of key and type, as the endpoint's does.
func TestReportClipsKeyAndType(t *testing.T) {
	var got handler.Report
	obs := handler.ObserverFunc(func(_ context.Context, r handler.Report) { got = r })
	long := strings.Repeat("k", 1000)
	Report(t.Context(), slog.New(slog.DiscardHandler), obs, "test", Reject, handler.Report{Source: "s", Key: long, Type: long})
	if len(got.Key) > clip.Max+len("…") || !strings.HasSuffix(got.Key, "…") || len(got.Type) > clip.Max+len("…") {
		t.Errorf("reported key of %d bytes and type of %d, want at most %d and …", len(got.Key), len(got.Type), clip.Max)
	}
}
