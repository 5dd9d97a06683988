package cli

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/testdb"
)

// BenchmarkMillionRows runs every read command and a prune on an events table
// of one million rows: 900,000 done rows completed 15 to 45 days ago, 80,000
// done in the last 13 days, 10,000 failed (old, with payloads) and 10,000 in
// progress. It is slow (it builds the table for each batch size) and runs
// only when asked for:
//
//	TEST_DATABASE_URL=postgres://... go test -run '^$' -bench MillionRows -benchtime 1x ./cli
//
// It reports the prune's deleted rows per second and the time each command
// took.
func BenchmarkMillionRows(b *testing.B) {
	for _, batch := range []int{1000, 10000} {
		b.Run("batch="+strconv.Itoa(batch), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				d := testdb.New(b)
				start := time.Now()
				if _, err := d.Pool.Exec(b.Context(), `
					INSERT INTO txhook_processed_events
						(source, event_key, event_type, status, created_at, claimed_at, completed_at,
						 lease_expires_at, last_error, payload)
					SELECT CASE WHEN g % 3 = 0 THEN 'github' ELSE 'stripe' END,
					       'evt_' || lpad(g::text, 24, '0'), 'invoice.paid', s.status, t.at, t.at,
					       CASE WHEN s.status <> 'in_progress' THEN t.at END,
					       CASE WHEN s.status = 'in_progress' THEN t.at + interval '5 minutes' END,
					       CASE WHEN s.status = 'failed' THEN 'permanent: no such customer' END,
					       CASE WHEN s.status = 'failed' THEN convert_to(repeat('x', 500), 'UTF8') END
					FROM generate_series(1, 1000000) AS g,
					LATERAL (SELECT CASE WHEN g <= 980000 THEN 'done'
					                     WHEN g <= 990000 THEN 'failed'
					                     ELSE 'in_progress' END AS status) AS s,
					LATERAL (SELECT now() - CASE WHEN g <= 900000 THEN interval '15 days' + (g % 2592000) * interval '1 second'
					                             WHEN g <= 980000 THEN ((g - 900000) * 14) * interval '1 second'
					                             ELSE interval '20 days' + (g % 1000) * interval '1 minute' END AS at) AS t`); err != nil {
					b.Fatal(err)
				}
				if _, err := d.Pool.Exec(b.Context(), "VACUUM ANALYZE txhook_processed_events"); err != nil {
					b.Fatal(err)
				}
				b.Logf("seeded 1,000,000 rows in %v", time.Since(start).Round(time.Millisecond))

				for _, args := range [][]string{
					{"stats"},
					{"events", "list"},
					{"events", "list", "--status", "failed"},
					{"events", "list", "--source", "github", "--since", "1d"},
					{"events", "show", "stripe", "evt_000000000000000000985001"},
					{"prune", "--older-than", "14d", "--dry-run"},
				} {
					t0 := time.Now()
					code, out, errOut := runForBench(b, d.URL, args...)
					if code != 0 {
						b.Fatalf("txhook %s: exit %d: %s", strings.Join(args, " "), code, errOut)
					}
					b.Logf("txhook %s: %v (%d lines)", strings.Join(args, " "), time.Since(t0).Round(time.Millisecond), strings.Count(out, "\n"))
				}

				b.StartTimer()
				t0 := time.Now()
				code, out, errOut := runForBench(b, d.URL, "prune", "--older-than", "14d", "--batch", strconv.Itoa(batch))
				elapsed := time.Since(t0)
				b.StopTimer()
				if code != 0 || !strings.HasPrefix(out, "deleted 900000 done events") {
					b.Fatalf("prune: exit %d: %s %s", code, out, errOut)
				}
				b.Logf("txhook prune --batch %d: %s", batch, strings.TrimSpace(out))
				b.ReportMetric(900000/elapsed.Seconds(), "rows/s")
				var left, inProgress int
				if err := d.Pool.QueryRow(b.Context(), "SELECT count(*), count(*) FILTER (WHERE status = 'in_progress') FROM txhook_processed_events").Scan(&left, &inProgress); err != nil {
					b.Fatal(err)
				}
				if left != 100000 || inProgress != 10000 {
					b.Fatalf("after prune: %d rows, %d in progress; want 100000 and 10000", left, inProgress)
				}
				b.StartTimer()
			}
		})
	}
}

func runForBench(b *testing.B, url string, args ...string) (int, string, string) {
	var out, errOut strings.Builder
	code := run(b.Context(), append([]string{"--database-url", url}, args...), env{stdout: &out, stderr: &errOut, progressEvery: time.Hour}, nil)
	return code, out.String(), errOut.String()
}
