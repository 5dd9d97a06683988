package txhook_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/internal/testdb"
)

// opsSeed inserts n rows with keys prefix1..prefixN in the given status,
// created and (unless in progress or queued) completed age ago. In-progress
// rows get a lease that ended a minute after their claim.
func opsSeed(t testing.TB, pool *pgxpool.Pool, status, prefix string, n int, age time.Duration) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
		INSERT INTO txhook_processed_events
			(source, event_key, event_type, status, created_at, claimed_at, completed_at, lease_expires_at, last_error, payload)
		SELECT 'test', $1 || g, 'thing.happened', $2, now() - $3::interval, now() - $3::interval,
		       CASE WHEN $2 IN ('in_progress', 'queued') THEN NULL ELSE now() - $3::interval END,
		       CASE WHEN $2 = 'in_progress' THEN now() - $3::interval + interval '1 minute' END,
		       CASE WHEN $2 = 'failed' THEN 'permanent: boom' END,
		       convert_to('{"n":' || g || '}', 'UTF8')
		FROM generate_series(1, $4::integer) AS g`,
		prefix, status, fmt.Sprintf("%d microseconds", age.Microseconds()), n)
	if err != nil {
		t.Fatalf("seed %s rows: %v", status, err)
	}
}

// opsCount returns the number of rows whose key starts with prefix and
// whose status is status ("" for any).
func opsCount(t testing.TB, pool *pgxpool.Pool, status, prefix string) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), `
		SELECT count(*) FROM txhook_processed_events
		WHERE ($1 = '' OR status = $1) AND starts_with(event_key, $2)`, status, prefix).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

const month = 30 * 24 * time.Hour

func TestPruneDeletesOnlyOldFinishedRows(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	opsSeed(t, d.Pool, "done", "old-", 250, month)
	opsSeed(t, d.Pool, "done", "recent-", 10, 24*time.Hour)
	opsSeed(t, d.Pool, "failed", "oldfail-", 5, month)
	opsSeed(t, d.Pool, "in_progress", "stuck-", 5, month)
	// Queued in inbox mode a month ago, their jobs still retrying (River's
	// 25 tries take about three weeks): never pruned, or the jobs would
	// find them gone and the events would be lost.
	opsSeed(t, d.Pool, "queued", "waiting-", 5, month)

	dry, err := txhook.Prune(t.Context(), d.Pool, txhook.PruneOptions{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if dry.Deleted != 250 || dry.Batches != 0 {
		t.Errorf("dry run = %+v, want 250 rows and no batches", dry)
	}
	if n := opsCount(t, d.Pool, "", "old-"); n != 250 {
		t.Fatalf("dry run deleted rows: %d old rows left", n)
	}

	var progress []int64
	res, err := txhook.Prune(t.Context(), d.Pool, txhook.PruneOptions{
		BatchSize: 100,
		Progress:  func(n int64) { progress = append(progress, n) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 250 || res.Batches != 3 || res.Locked {
		t.Errorf("prune = %+v, want 250 rows in 3 batches", res)
	}
	if fmt.Sprint(progress) != "[100 200 250]" {
		t.Errorf("progress = %v, want [100 200 250]", progress)
	}
	if age := time.Since(res.Cutoff); age < txhook.DefaultRetention-time.Minute || age > txhook.DefaultRetention+time.Minute {
		t.Errorf("cutoff %v is %v ago, want the default retention", res.Cutoff, age)
	}
	for prefix, want := range map[string]int{"old-": 0, "recent-": 10, "oldfail-": 5, "stuck-": 5, "waiting-": 5} {
		if n := opsCount(t, d.Pool, "", prefix); n != want {
			t.Errorf("%s rows = %d, want %d", prefix, n, want)
		}
	}

	res, err = txhook.Prune(t.Context(), d.Pool, txhook.PruneOptions{IncludeFailed: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 5 {
		t.Errorf("prune with failed rows deleted %d, want 5", res.Deleted)
	}
	if n := opsCount(t, d.Pool, "in_progress", "stuck-"); n != 5 {
		t.Errorf("in-progress rows = %d, want all 5 kept", n)
	}
	if n := opsCount(t, d.Pool, "queued", "waiting-"); n != 5 {
		t.Errorf("queued rows = %d, want all 5 kept", n)
	}
	if n := opsCount(t, d.Pool, "", "oldfail-"); n != 0 {
		t.Errorf("old failed rows = %d, want 0", n)
	}

	// A short retention reaches the recent rows, never the in-progress or
	// queued ones.
	res, err = txhook.Prune(t.Context(), d.Pool, txhook.PruneOptions{OlderThan: time.Hour, IncludeFailed: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 10 || opsCount(t, d.Pool, "", "") != 10 {
		t.Errorf("prune of 1h deleted %d, %d rows left; want 10 deleted and the 5 in progress and 5 queued left", res.Deleted, opsCount(t, d.Pool, "", ""))
	}
}

func TestPruneRejectsBadOptions(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	for _, o := range []txhook.PruneOptions{{OlderThan: -time.Hour}, {BatchSize: -1}} {
		if _, err := txhook.Prune(t.Context(), d.Pool, o); err == nil {
			t.Errorf("Prune(%+v) succeeded, want an error", o)
		}
	}
	if _, err := txhook.NewPruner(d.Pool, &txhook.PrunerConfig{Interval: -time.Second}); err == nil {
		t.Error("NewPruner with a negative interval succeeded")
	}
}

func TestPruneStopsWhileAnotherPrunerHoldsTheLock(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	opsSeed(t, d.Pool, "done", "old-", 20, month)

	tx, err := d.Pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(t.Context(), "SELECT pg_advisory_xact_lock($1)", int64(0x7478686f6f6b5052)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), waitBound) // a pruner that waited for the lock would fail here
	defer cancel()
	res, err := txhook.Prune(ctx, d.Pool, txhook.PruneOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Locked || res.Deleted != 0 || opsCount(t, d.Pool, "", "old-") != 20 {
		t.Errorf("prune while locked = %+v, want Locked and nothing deleted", res)
	}
	if err := tx.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	res, err = txhook.Prune(t.Context(), d.Pool, txhook.PruneOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Locked || res.Deleted != 20 {
		t.Errorf("prune after unlock = %+v, want 20 deleted", res)
	}
}

func TestTwoPrunersAtOnce(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	const rows = 3000
	opsSeed(t, d.Pool, "done", "old-", rows, month)
	opsSeed(t, d.Pool, "in_progress", "stuck-", 20, month)

	var wg sync.WaitGroup
	results := make([]txhook.PruneResult, 2)
	errs := make([]error, 2)
	for i := range results {
		wg.Go(func() {
			results[i], errs[i] = txhook.Prune(t.Context(), d.Pool, txhook.PruneOptions{BatchSize: 50})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("pruner %d: %v", i, err)
		}
	}
	if got := results[0].Deleted + results[1].Deleted; got != rows {
		t.Errorf("pruners deleted %d + %d rows, want %d in total", results[0].Deleted, results[1].Deleted, rows)
	}
	if n := opsCount(t, d.Pool, "", "old-"); n != 0 {
		t.Errorf("%d old rows left", n)
	}
	if n := opsCount(t, d.Pool, "in_progress", "stuck-"); n != 20 {
		t.Errorf("in-progress rows = %d, want 20", n)
	}
	t.Logf("pruner results: %+v / %+v", results[0], results[1])
}

// Deliveries keep arriving while a prune runs: new events, and redeliveries
// of events inside the retention window, which must stay duplicates.
func TestPruneUnderConcurrentInserts(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	if _, err := d.Pool.Exec(t.Context(), "CREATE TABLE ops_effects (event_key text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	const recent = 200
	opsSeed(t, d.Pool, "done", "old-", 5000, month)
	opsSeed(t, d.Pool, "done", "recent-", recent, 13*24*time.Hour)
	opsSeed(t, d.Pool, "in_progress", "stuck-", 50, month)
	opsSeed(t, d.Pool, "failed", "oldfail-", 20, month)

	p, err := txhook.NewProcessor(d.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		_, err := tx.Exec(ctx, "INSERT INTO ops_effects (event_key) VALUES ($1)", ev.Key)
		return err
	}

	done := make(chan struct{})
	var res txhook.PruneResult
	var pruneErr error
	go func() {
		defer close(done)
		res, pruneErr = txhook.Prune(t.Context(), d.Pool, txhook.PruneOptions{BatchSize: 100})
	}()

	var wg sync.WaitGroup
	var mu sync.Mutex
	newKeys := 0
	for w := range 3 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					if i > 0 {
						return
					}
				default:
				}
				ev := txhook.Event{Source: "test", Key: fmt.Sprintf("new-%d-%d", w, i), Type: "thing.happened"}
				if r, err := p.Process(t.Context(), ev, h); err != nil || r.Outcome != txhook.OutcomeProcessed {
					t.Errorf("new event %s: %v %v", ev.Key, r.Outcome, err)
					return
				}
				ev.Key = fmt.Sprintf("recent-%d", 1+(w*101+i)%recent)
				if r, err := p.Process(t.Context(), ev, h); err != nil || r.Outcome != txhook.OutcomeDuplicate {
					t.Errorf("redelivery of %s inside the window: %v %v, want duplicate", ev.Key, r.Outcome, err)
					return
				}
				mu.Lock()
				newKeys++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	<-done
	if pruneErr != nil {
		t.Fatal(pruneErr)
	}
	if res.Deleted != 5000 {
		t.Errorf("pruned %d rows, want 5000", res.Deleted)
	}
	for prefix, want := range map[string]int{"old-": 0, "recent-": recent, "stuck-": 50, "oldfail-": 20, "new-": newKeys} {
		if n := opsCount(t, d.Pool, "", prefix); n != want {
			t.Errorf("%s rows = %d, want %d", prefix, n, want)
		}
	}
	var effects, recentEffects int
	if err := d.Pool.QueryRow(t.Context(), "SELECT count(*), count(*) FILTER (WHERE starts_with(event_key, 'recent-')) FROM ops_effects").Scan(&effects, &recentEffects); err != nil {
		t.Fatal(err)
	}
	if effects != newKeys || recentEffects != 0 {
		t.Errorf("effects = %d (%d of redelivered events), want %d and 0", effects, recentEffects, newKeys)
	}
	t.Logf("%d new events and %d redeliveries during the prune", newKeys, newKeys)
}

func TestPrunerRunsUntilContextEnds(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	opsSeed(t, d.Pool, "done", "old-", 30, month)
	opsSeed(t, d.Pool, "done", "recent-", 5, time.Minute)

	pr, err := txhook.NewPruner(d.Pool, &txhook.PrunerConfig{Interval: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(t.Output(), nil)), Options: txhook.PruneOptions{BatchSize: 7}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		pr.Run(ctx)
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(waitBound)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("first prune", func() bool { return opsCount(t, d.Pool, "", "old-") == 0 })
	opsSeed(t, d.Pool, "done", "later-", 10, month)
	waitFor("a later prune", func() bool { return opsCount(t, d.Pool, "", "later-") == 0 })
	if n := opsCount(t, d.Pool, "", "recent-"); n != 5 {
		t.Errorf("recent rows = %d, want 5", n)
	}
	cancel()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// A row locked by a replay in progress is skipped, not waited for.
func TestPruneSkipsRowsLockedByAReplay(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	opsSeed(t, d.Pool, "failed", "oldfail-", 3, month)
	tx, err := d.Pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(t.Context(), "SELECT 1 FROM txhook_processed_events WHERE event_key = 'oldfail-2' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	res, err := txhook.Prune(ctx, d.Pool, txhook.PruneOptions{IncludeFailed: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 2 || opsCount(t, d.Pool, "", "oldfail-2") != 1 {
		t.Errorf("prune = %+v, want the 2 unlocked rows deleted and oldfail-2 kept", res)
	}
}

func TestPruneStopsBetweenBatchesWhenContextEnds(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	opsSeed(t, d.Pool, "done", "old-", 50, month)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	res, err := txhook.Prune(ctx, d.Pool, txhook.PruneOptions{BatchSize: 10, Progress: func(int64) { cancel() }})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error = %v, want context.Canceled", err)
	}
	if res.Deleted != 10 || res.Batches != 1 || opsCount(t, d.Pool, "", "old-") != 40 {
		t.Errorf("prune = %+v with %d rows left, want one committed batch of 10", res, opsCount(t, d.Pool, "", "old-"))
	}
}
