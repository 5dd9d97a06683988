package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
)

// TestBodyDedupeOnInboxRoutes: GitHub's delivery id is not signed, so the
// endpoint's body dedupe is on, and an inbox route runs its check in the
// accepting transaction. A captured push sent again under fresh delivery ids,
// one after the other and then several at once, is answered "duplicate_body"
// (or in flight while another delivery of the body holds the guard's lock):
// nothing is queued for the fresh ids, and the push is applied once.
func TestBodyDedupeOnInboxRoutes(t *testing.T) {
	t.Parallel()
	lease := txhook.LeaseHandler{Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
		return func(ctx context.Context, tx pgx.Tx) error { return apply(ctx, tx, ev) }, nil
	}}
	for _, mode := range []string{"tx", "lease"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			s := newSetup(t, nil)
			if mode == "lease" {
				s.routes.InboxLease("github", "push", lease)
			} else {
				s.routes.Inbox("github", "push", apply)
			}
			srv := s.endpoint(t)
			body := []byte(`{"ref":"refs/heads/main","after":"c0ffee"}`)
			if code, answer := deliverBody(t, srv, "d-1", body); code != http.StatusAccepted {
				t.Fatalf("first delivery: %d %s, want 202", code, answer)
			}
			if code, answer := deliverBody(t, srv, "d-2", body); code != http.StatusOK || status(answer) != "duplicate_body" {
				t.Errorf("the body again under d-2: %d %s, want 200 replay", code, answer)
			}
			var wg sync.WaitGroup
			for _, key := range []string{"d-3", "d-4", "d-5", "d-6"} {
				wg.Go(func() {
					code, answer := deliverBody(t, srv, key, body)
					if !(code == http.StatusOK && status(answer) == "duplicate_body") && code != http.StatusConflict {
						t.Errorf("the body again under %s, concurrently: %d %s, want 200 replay or 409 in flight", key, code, answer)
					}
				})
			}
			wg.Wait()

			s.start(t)
			s.waitStatus(t, "d-1", txhook.StatusDone)
			for _, key := range []string{"d-2", "d-3", "d-4", "d-5", "d-6"} {
				if _, err := txhook.GetEventRecord(t.Context(), s.db.Pool, "github", key); !errors.Is(err, txhook.ErrEventNotFound) {
					t.Errorf("%s: recorded (%v), want nothing recorded for a replay", key, err)
				}
			}
			if n := s.jobs(t); n != 1 {
				t.Errorf("%d jobs, want the first delivery's only", n)
			}
			if n := s.applied(t, "d-1"); n != 1 {
				t.Errorf("the push applied %d times, want once", n)
			}
		})
	}
}

// status returns the "status" of an endpoint's JSON answer ("" when it has
// none).
func status(answer string) string {
	var a struct {
		Status string `json:"status"`
	}
	_ = json.Unmarshal([]byte(answer), &a)
	return a.Status
}
