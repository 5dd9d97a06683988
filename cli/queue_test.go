package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/internal/testdb"
)

// TestStatsShowsQueue: events accepted in inbox mode show in stats as
// queued, with the age of the oldest, and in events get with their job.
func TestStatsShowsQueue(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	routes := txhook.NewRoutes()
	routes.Inbox("github", "push", func(context.Context, pgx.Tx, txhook.Event) error { return nil })
	proc, err := txhook.NewProcessor(d.Pool, &txhook.Config{Routes: routes})
	if err != nil {
		t.Fatal(err)
	}
	if err := proc.UseQueue(&countingQueue{next: 41}); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"q-1", "q-2"} {
		res, err := proc.Deliver(t.Context(), txhook.Event{Source: "github", Key: key, Type: "push"}, nil)
		if err != nil || res.Outcome != txhook.OutcomeQueued {
			t.Fatalf("Accept %s = %v, %v", key, res.Outcome, err)
		}
	}
	if _, err := d.Pool.Exec(t.Context(), `UPDATE txhook_processed_events SET created_at = now() - interval '90 seconds' WHERE event_key = 'q-1'`); err != nil {
		t.Fatal(err)
	}
	out := mustRun(t, d.URL, "stats")
	if !strings.Contains(out, "inbox queue: 2 events queued, the oldest accepted 1m30s ago") {
		t.Errorf("stats output lacks the queue:\n%s", out)
	}
	if !strings.Contains(out, "QUEUED") {
		t.Errorf("stats table lacks the QUEUED column:\n%s", out)
	}
	s, err := txhook.ReadStats(t.Context(), d.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if s.Queue.Queued != 2 || s.Total != 2 || s.Queue.OldestAge < 89*time.Second || s.Queue.OldestAge > 120*time.Second {
		t.Errorf("stats = %+v, want 2 queued, the oldest about 90s old", s)
	}
	if out := mustRun(t, d.URL, "events", "list", "--status", "queued"); !strings.Contains(out, "q-1") || !strings.Contains(out, "q-2") {
		t.Errorf("events list --status queued:\n%s", out)
	}
	rec, err := txhook.GetEventRecord(t.Context(), d.Pool, "github", "q-2")
	if err != nil || rec.JobID != 42 {
		t.Errorf("record of q-2 = %+v, %v; want job 42", rec, err)
	}
}

// countingQueue is a queue whose jobs are numbered from next, inserted
// nowhere.
type countingQueue struct{ next int64 }

func (q *countingQueue) Enqueue(context.Context, pgx.Tx, txhook.Event) (int64, error) {
	id := q.next
	q.next++
	return id, nil
}
