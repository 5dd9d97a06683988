package admin_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
)

// TestDiscardDeletesOnlyDeadLetters: Discard deletes an event only while it
// is failed. A dead-letters page rendered before a replay, whose Discard is
// pressed after it, leaves the replayed (done) event alone, so the sender's
// redelivery stays a duplicate; and events queued, in progress (a lease
// claim or a replay's) or done are never deleted, whatever the form names.
func TestDiscardDeletesOnlyDeadLetters(t *testing.T) {
	t.Parallel()
	c := newConsole(t, "stripe", map[string]txhook.HandlerFunc{"invoice.paid": addToLedger})
	_, err := c.pool.Exec(t.Context(), `
		INSERT INTO txhook_processed_events (source, event_key, event_type, status, attempts, claimed_at,
		                                     lease_expires_at, completed_at, last_error, payload)
		VALUES ('stripe', 'evt_dead', 'invoice.paid', 'failed', 1, now(), NULL, now(), 'permanent: no account', '{"id":"evt_dead"}'),
		       ('stripe', 'evt_claimed', 'invoice.paid', 'in_progress', 1, now(), now() + interval '1 hour', NULL, NULL, NULL),
		       ('stripe', 'evt_done', 'invoice.paid', 'done', 1, now(), NULL, now(), NULL, NULL),
		       ('stripe', 'evt_other_dead', 'invoice.paid', 'failed', 1, now(), NULL, now(), 'permanent: no account', NULL)`)
	if err != nil {
		t.Fatal(err)
	}
	// Accepted in inbox mode, waiting for its job (whose id stands in here).
	routes := txhook.NewRoutes()
	routes.Inbox("stripe", "invoice.paid", addToLedger)
	p, err := txhook.NewProcessor(c.pool, &txhook.Config{Routes: routes})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.UseQueue(jobOne{}); err != nil {
		t.Fatal(err)
	}
	queued := txhook.Event{Source: "stripe", Key: "evt_queued", Type: "invoice.paid", Payload: []byte(`{"id":"evt_queued"}`)}
	if res, err := p.Deliver(t.Context(), queued, nil); err != nil || res.Outcome != txhook.OutcomeQueued {
		t.Fatalf("accept = %v, %v; want queued", res.Outcome, err)
	}
	code, page := c.get("dead-letters")
	if code != http.StatusOK || !strings.Contains(page, formID("stripe", "evt_dead")) {
		t.Fatalf("dead letters: status %d, want 200 offering evt_dead: %s", code, page)
	}

	// Replayed from another tab (or by another operator): done, applied once.
	if code, body := c.post("replay", page, url.Values{"one": {formID("stripe", "evt_dead")}}); code != http.StatusOK ||
		!strings.Contains(body, "replayed: processed") {
		t.Fatalf("replay: status %d: %s", code, body)
	}
	// The stale page's Discard, for the replayed event and for every row
	// that is not a dead letter; one dead letter to show that it deletes.
	form := url.Values{}
	for _, key := range []string{"evt_dead", "evt_queued", "evt_claimed", "evt_done", "evt_other_dead"} {
		form.Add("ev", formID("stripe", key))
	}
	code, body := c.post("discard", page, form)
	if code != http.StatusOK || !strings.Contains(pageText(body), "Discard: 1 of 5 done.") {
		t.Errorf("discard: status %d, want 200 and 1 of 5 done: %s", code, pageText(body))
	}
	for key, want := range map[string]string{
		"evt_dead": "done", "evt_queued": "queued", "evt_claimed": "in_progress", "evt_done": "done", "evt_other_dead": "absent",
	} {
		if got := c.status("stripe", key); got != want {
			t.Errorf("%s: status %s after the discard, want %s", key, got, want)
		}
	}

	// The sender redelivers the replayed event: a duplicate, applied once.
	res, err := p.Process(t.Context(), txhook.Event{Source: "stripe", Key: "evt_dead", Type: "invoice.paid", Payload: []byte(`{"id":"evt_dead"}`)}, addToLedger)
	if err != nil || res.Outcome != txhook.OutcomeDuplicate {
		t.Errorf("redelivery of the replayed event = %v, %v; want duplicate", res.Outcome, err)
	}
	if n := c.ledger("evt_dead"); n != 1 {
		t.Errorf("evt_dead applied %d times, want once", n)
	}
}

// jobOne is a queue whose every job is number 1, inserted nowhere.
type jobOne struct{}

func (jobOne) Enqueue(context.Context, pgx.Tx, txhook.Event) (int64, error) { return 1, nil }
