package db

import (
	"strings"
	"testing"

	"github.com/txhook/txhook/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// TestQueriesReadTheirIndexes checks that each query reading the events
// table by status or time can be planned on the partial index meant for
// it: the index's predicate must follow from the query's conditions, for
// the generic plan a prepared statement ends up with too. Sequential scans
// are disabled so that the tiny test table does not decide the plan.
func TestQueriesReadTheirIndexes(t *testing.T) {
	t.Parallel()
	d := testdb.New(t, testdb.TxhookTemplate)
	ctx := t.Context()
	conn, err := d.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, s := range []string{
		"SET enable_seqscan = off",
		"SET plan_cache_mode = force_generic_plan",
	} {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	const (
		completedAt = "txhook_processed_events_completed_at_idx"
		notDone     = "txhook_processed_events_not_done_idx"
	)
	since, page := "now() - interval '1 day'", "'infinity', '', ''"
	for _, c := range []struct {
		name, sql, args, index string
	}{
		{"PruneBatch", pruneBatch, "true, now(), 100", completedAt},
		{"CountPrunable", countPrunable, "false, now()", completedAt},
		{"AdminSettledCountsSince", adminSettledCountsSince, since, completedAt},
		{"AdminSettledPerMinute", adminSettledPerMinute, since, completedAt},
		{"AdminSettledPage", adminSettledPage, "'', '', '', " + since + ", " + page + ", 50", completedAt},
		{"AdminOpenCounts", adminOpenCounts, "", notDone},
		{"AdminOpenPage", adminOpenPage, "'failed', '', '', " + since + ", " + page + ", 50", notDone},
		{"AdminQueuedPage", adminQueuedPage, "'', '', " + since + ", " + page + ", 50", notDone},
		{"QueueStats", queueStats, "", notDone},
		{"OldestInProgress", oldestInProgress, "", notDone},
		{"ListFailedEvents", listFailedEvents, "NULL, NULL, 50", notDone},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := conn.Exec(ctx, "PREPARE q AS "+c.sql); err != nil {
				t.Fatal(err)
			}
			defer conn.Exec(ctx, "DEALLOCATE q")
			exec := "EXECUTE q"
			if c.args != "" {
				exec += "(" + c.args + ")"
			}
			rows, err := conn.Query(ctx, "EXPLAIN "+exec)
			if err != nil {
				t.Fatal(err)
			}
			var plan []string
			for rows.Next() {
				var line string
				if err := rows.Scan(&line); err != nil {
					t.Fatal(err)
				}
				plan = append(plan, line)
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			if text := strings.Join(plan, "\n"); !strings.Contains(text, c.index) {
				t.Errorf("plan does not read %s:\n%s", c.index, text)
			}
		})
	}
}
