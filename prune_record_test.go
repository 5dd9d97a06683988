package txhook_test

import (
	"testing"
	"time"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/internal/testdb"
)

func TestPruneRecordsItsLatestRun(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	type run struct {
		deleted                 int64
		batches                 int
		started, lastBatch      time.Time
		cutoff                  time.Time
		includeFailed, recorded bool
	}
	last := func() run {
		t.Helper()
		var r run
		rows, err := d.Pool.Query(t.Context(), "SELECT deleted, batches, started_at, last_batch_at, cutoff, include_failed FROM txhook_prune_runs")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		n := 0
		for rows.Next() {
			n++
			if err := rows.Scan(&r.deleted, &r.batches, &r.started, &r.lastBatch, &r.cutoff, &r.includeFailed); err != nil {
				t.Fatal(err)
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if n > 1 {
			t.Fatalf("%d prune records, want at most one", n)
		}
		r.recorded = n == 1
		return r
	}
	if last().recorded {
		t.Fatal("a prune record before any prune")
	}
	opsSeed(t, d.Pool, "done", "old_", 5, 20*24*time.Hour)
	opsSeed(t, d.Pool, "failed", "oldfail_", 1, 20*24*time.Hour)

	if _, err := txhook.Prune(t.Context(), d.Pool, txhook.PruneOptions{DryRun: true}); err != nil {
		t.Fatal(err)
	}
	if last().recorded {
		t.Error("a dry run recorded a prune run")
	}

	res, err := txhook.Prune(t.Context(), d.Pool, txhook.PruneOptions{BatchSize: 2})
	if err != nil || res.Deleted != 5 {
		t.Fatalf("prune: %+v, %v", res, err)
	}
	first := last()
	if !first.recorded || first.deleted != 5 || first.batches != 3 || first.includeFailed || first.lastBatch.Before(first.started) {
		t.Errorf("after a run of 3 batches deleting 5 rows: %+v", first)
	}
	// The run's start is the database's time of its cutoff, the clock of
	// last_batch_at: a run never seems to start after its last batch.
	if got := first.started.Sub(first.cutoff); got != txhook.DefaultRetention {
		t.Errorf("started_at - cutoff = %v, want the retention %v (one clock, one instant)", got, txhook.DefaultRetention)
	}

	// A new run starts a new record rather than adding to the last one.
	res, err = txhook.Prune(t.Context(), d.Pool, txhook.PruneOptions{BatchSize: 2, IncludeFailed: true})
	if err != nil || res.Deleted != 1 {
		t.Fatalf("second prune: %+v, %v", res, err)
	}
	if second := last(); second.deleted != 1 || second.batches != 1 || !second.includeFailed || !second.started.After(first.started) {
		t.Errorf("after a second run deleting 1 row: %+v (first %+v)", second, first)
	}
}
