package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/migrations"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// txhookCLI runs the command line in-process and returns its exit status
// and outputs.
func txhookCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(t.Context(), args, env{stdin: strings.NewReader(""), stdout: &out, stderr: &errOut, progressEvery: time.Hour}, nil)
	return code, out.String(), errOut.String()
}

// mustRun runs args with the database URL and fails unless the exit status
// is 0.
func mustRun(t *testing.T, url string, args ...string) string {
	t.Helper()
	code, out, errOut := txhookCLI(t, append([]string{"--database-url", url}, args...)...)
	if code != 0 {
		t.Fatalf("txhook %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// seed inserts n rows with keys prefix1..prefixN of source "stripe" in the
// given status, created and (unless in progress or queued) completed age ago.
// In-progress rows get a lease that ended a minute after their claim.
func seed(t *testing.T, pool *pgxpool.Pool, status, prefix string, n int, age time.Duration) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
		INSERT INTO txhook_processed_events
			(source, event_key, event_type, status, created_at, claimed_at, completed_at, lease_expires_at, last_error, payload)
		SELECT 'stripe', $1 || g, 'invoice.paid', $2, now() - $3::interval, now() - $3::interval,
		       CASE WHEN $2 IN ('in_progress', 'queued') THEN NULL ELSE now() - $3::interval END,
		       CASE WHEN $2 = 'in_progress' THEN now() - $3::interval + interval '1 minute' END,
		       CASE WHEN $2 = 'failed' THEN 'permanent: no such customer' END,
		       convert_to('{"id":"' || $1 || g || '"}', 'UTF8')
		FROM generate_series(1, $4::integer) AS g`,
		prefix, status, fmt.Sprintf("%d microseconds", age.Microseconds()), n)
	if err != nil {
		t.Fatalf("seed: %v", err)
	}
}

func count(t *testing.T, pool *pgxpool.Pool, where string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM txhook_processed_events WHERE "+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestHelpGoesToStdout(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--help"}, "Commands:"},
		{[]string{"help"}, "Commands:"},
		{[]string{"help", "prune"}, "Usage: txhook prune"},
		{[]string{"help", "replay"}, "Usage: txhook replay"},
		{[]string{"migrate", "--help"}, "Usage: txhook migrate"},
		{[]string{"events", "list", "--help"}, "--since"},
		{[]string{"events", "show", "--help"}, "SOURCE KEY"},
		{[]string{"dead-letters", "--help"}, "Usage: txhook dead-letters"},
		{[]string{"replay", "--help"}, "--dry-run"},
		{[]string{"stats", "--help"}, "Usage: txhook stats"},
		{[]string{"prune", "--help"}, "--older-than"},
	} {
		code, out, errOut := txhookCLI(t, c.args...)
		if code != 0 || !strings.Contains(out, c.want) || errOut != "" {
			t.Errorf("txhook %q: exit %d, stdout %q, stderr %q; want exit 0 and %q on stdout only", c.args, code, out, errOut, c.want)
		}
	}
}

func TestOneErrorLinePerMistake(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args   []string
		stderr string
	}{
		{[]string{"bogus"}, `txhook: unknown command "bogus" (see txhook --help)`},
		{[]string{"--bogus"}, "txhook: flag provided but not defined: -bogus (see txhook --help)"},
		{[]string{"prune", "--bogus"}, "txhook prune: flag provided but not defined: -bogus (see txhook prune --help)"},
		{[]string{"events", "list", "--bogus", "x"}, "txhook events: flag provided but not defined: -bogus"},
		{[]string{"migrate"}, "missing subcommand"},
		{[]string{"migrate", "sideways"}, `unknown subcommand "sideways"`},
		{[]string{"migrate", "down", "zero"}, "N must be a positive number"},
		{[]string{"migrate", "down", "1", "--all"}, "not both"},
		{[]string{"migrate", "up", "--yes"}, "--yes goes with down --all only"},
		{[]string{"events"}, "missing subcommand"},
		{[]string{"events", "list", "--status", "lost"}, "--status must be"},
		{[]string{"events", "list", "--since", "last tuesday"}, "--since"},
		{[]string{"events", "list", "--limit", "0"}, "--limit"},
		{[]string{"events", "show", "stripe"}, "want SOURCE and KEY"},
		{[]string{"dead-letters", "extra"}, `unexpected argument "extra"`},
		{[]string{"replay"}, "want SOURCE and KEY, or --all"},
		{[]string{"replay", "--all", "stripe", "evt_1"}, "not both"},
		{[]string{"replay", "--source", "stripe", "stripe", "evt_1"}, "--source and --type go with --all"},
		{[]string{"stats", "extra"}, `unexpected argument "extra"`},
		{[]string{"prune", "--older-than", "soon"}, "invalid duration"},
		{[]string{"prune", "--older-than", "0s"}, "more than 0"},
		{[]string{"prune", "--batch", "0"}, "--batch"},
	} {
		code, out, errOut := txhookCLI(t, c.args...)
		if code != 2 || !strings.Contains(errOut, c.stderr) {
			t.Errorf("txhook %q: exit %d, stderr %q; want exit 2 and %q", c.args, code, errOut, c.stderr)
		}
		if n := strings.Count(errOut, "\n"); n != 1 {
			t.Errorf("txhook %q: %d lines on stderr, want one:\n%s", c.args, n, errOut)
		}
		if out != "" {
			t.Errorf("txhook %q: a usage error wrote to stdout: %q", c.args, out)
		}
	}
	// No command at all: the usage, on stderr.
	if code, out, errOut := txhookCLI(t); code != 2 || out != "" || !strings.Contains(errOut, "Commands:") {
		t.Errorf("txhook: exit %d, stdout %q, stderr %q; want 2 and the usage on stderr", code, out, errOut)
	}
}

func TestDatabaseURLFromEnvironment(t *testing.T) {
	d := testdb.New(t)
	t.Setenv("DATABASE_URL", "")
	if code, _, errOut := txhookCLI(t, "stats"); code != 2 || !strings.Contains(errOut, "no database") {
		t.Errorf("stats without a database: exit %d, %q; want 2 and a hint", code, errOut)
	}
	t.Setenv("DATABASE_URL", d.URL)
	if code, out, errOut := txhookCLI(t, "stats"); code != 0 || !strings.Contains(out, "no events") {
		t.Errorf("stats with DATABASE_URL: exit %d, %q %q", code, out, errOut)
	}
	// The flag wins over the environment.
	t.Setenv("DATABASE_URL", "postgres://nobody@127.0.0.1:1/nowhere?connect_timeout=2")
	if code, _, errOut := txhookCLI(t, "stats"); code != 1 || !strings.Contains(errOut, "connect") {
		t.Errorf("stats with an unreachable DATABASE_URL: exit %d, %q; want 1", code, errOut)
	}
	if code, _, errOut := txhookCLI(t, "stats", "--database-url", d.URL); code != 0 {
		t.Errorf("stats --database-url: exit %d, %q", code, errOut)
	}
}

var versionLine = regexp.MustCompile(`^version (\d+) \(latest (\d+), ([^)]*)\)\n$`)

func migrationVersion(t *testing.T, url string) int {
	t.Helper()
	out := mustRun(t, url, "migrate", "version")
	m := versionLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("migrate version printed %q", out)
	}
	v, _ := strconv.Atoi(m[1])
	return v
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	empty := testdb.Template{Name: "empty", Migrate: func(context.Context, string) error { return nil }}
	d := testdb.New(t, empty)
	latest, err := migrations.Latest()
	if err != nil {
		t.Fatal(err)
	}
	tableExists := func() bool {
		var ok bool
		if err := d.Pool.QueryRow(t.Context(), "SELECT to_regclass('txhook_processed_events') IS NOT NULL").Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}

	if out := mustRun(t, d.URL, "migrate", "version"); !strings.Contains(out, "version 0 (") || !strings.Contains(out, "pending migrations") {
		t.Errorf("version on a fresh database: %q", out)
	}
	if out := mustRun(t, d.URL, "migrate", "up"); out != fmt.Sprintf("version %d (latest %d, up to date)\n", latest, latest) {
		t.Errorf("migrate up printed %q", out)
	}
	if !tableExists() {
		t.Fatal("no events table after migrate up")
	}
	mustRun(t, d.URL, "migrate", "up") // nothing to do is success

	mustRun(t, d.URL, "migrate", "down")
	if v := migrationVersion(t, d.URL); v >= int(latest) || v == 0 {
		t.Errorf("version after down = %d, want between 0 and %d", v, latest)
	}
	mustRun(t, d.URL, "migrate", "down", "--all", "--yes")
	if v := migrationVersion(t, d.URL); v != 0 || tableExists() {
		t.Errorf("after down --all: version %d, table exists %v", v, tableExists())
	}
	mustRun(t, d.URL, "migrate", "up")
	if v := migrationVersion(t, d.URL); v != int(latest) {
		t.Errorf("version after up again = %d, want %d", v, latest)
	}
}

func TestEventsList(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	if out := mustRun(t, d.URL, "events", "list"); out != "no events\n" {
		t.Errorf("list on an empty table: %q", out)
	}
	seed(t, d.Pool, "done", "evt_done_", 3, 48*time.Hour)
	seed(t, d.Pool, "failed", "evt_failed_", 2, time.Hour)
	seed(t, d.Pool, "in_progress", "evt_busy_", 1, time.Minute)

	out := mustRun(t, d.URL, "events", "list")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 7 {
		t.Fatalf("list printed %d lines, want a header and 6 events:\n%s", len(lines), out)
	}
	header := lines[0]
	if !strings.HasPrefix(header, "SOURCE  KEY") || !strings.Contains(header, "LAST ERROR") {
		t.Errorf("header = %q", header)
	}
	// Aligned: every row's status starts in the STATUS column.
	col := strings.Index(header, "STATUS")
	for _, l := range lines[1:] {
		if st := strings.Fields(l[col:])[0]; st != "done" && st != "failed" && st != "in_progress" {
			t.Errorf("row %q has %q in the STATUS column", l, st)
		}
	}
	if !strings.HasPrefix(lines[1], "stripe  evt_busy_1") || !strings.Contains(lines[2], "permanent: no such customer") {
		t.Errorf("rows not newest first with errors:\n%s", out)
	}

	out = mustRun(t, d.URL, "events", "list", "--status", "failed", "--limit", "1", "--source", "stripe")
	if n := strings.Count(out, "\n"); n != 2 || !strings.Contains(out, "evt_failed_") {
		t.Errorf("list --status failed --limit 1:\n%s", out)
	}
	out = mustRun(t, d.URL, "events", "list", "--since", "1d")
	if strings.Contains(out, "evt_done_") || !strings.Contains(out, "evt_failed_1") {
		t.Errorf("list --since 1d:\n%s", out)
	}

	// Queued in inbox mode, and stuck: the claim whose lease ended (it has no
	// job that would take it over).
	seed(t, d.Pool, "queued", "evt_queued_", 1, time.Minute)
	out = mustRun(t, d.URL, "events", "list", "--status", "queued")
	if n := strings.Count(out, "\n"); n != 2 || !strings.Contains(out, "evt_queued_1") {
		t.Errorf("list --status queued:\n%s", out)
	}
	out = mustRun(t, d.URL, "events", "list", "--status", "stuck")
	if n := strings.Count(out, "\n"); n != 2 || !strings.Contains(out, "evt_busy_1") {
		t.Errorf("list --status stuck:\n%s", out)
	}

	var evs []map[string]any
	out = mustRun(t, d.URL, "events", "list", "--json", "--status", "done")
	if err := json.Unmarshal([]byte(out), &evs); err != nil {
		t.Fatalf("list --json: %v\n%s", err, out)
	}
	if len(evs) != 3 || evs[0]["status"] != "done" || evs[0]["source"] != "stripe" || evs[0]["has_payload"] != true {
		t.Errorf("list --json = %v", evs)
	}
}

func TestEventsShow(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	seed(t, d.Pool, "failed", "evt_", 1, time.Hour)

	out := mustRun(t, d.URL, "events", "show", "stripe", "evt_1")
	for _, want := range []string{"status:", "failed", "attempts:", "last error:", "permanent: no such customer", "14 bytes, below", `{"id":"evt_1"}`} {
		if !strings.Contains(out, want) {
			t.Errorf("show output lacks %q:\n%s", want, out)
		}
	}
	var got map[string]any
	out = mustRun(t, d.URL, "events", "show", "--json", "stripe", "evt_1")
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("show --json: %v\n%s", err, out)
	}
	if p, _ := got["payload"].(map[string]any); got["key"] != "evt_1" || p["id"] != "evt_1" {
		t.Errorf("show --json = %v", got)
	}

	code, out, errOut := txhookCLI(t, "--database-url", d.URL, "events", "show", "stripe", "evt_missing")
	if code != 1 || out != "" || !strings.Contains(errOut, `no event with source "stripe" and key "evt_missing"`) {
		t.Errorf("show of a missing event: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func TestEventKeysCannotDriveTheTerminal(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	if _, err := d.Pool.Exec(t.Context(), `INSERT INTO txhook_processed_events (source, event_key, status, completed_at)
		VALUES ('stripe', E'evt\x1b[2J\tx\ny', 'done', now())`); err != nil {
		t.Fatal(err)
	}
	out := mustRun(t, d.URL, "events", "list")
	if strings.ContainsAny(out, "\x1b\t") || strings.Count(out, "\n") != 2 || !strings.Contains(out, `"evt\x1b[2J\tx\ny"`) {
		t.Errorf("control characters reached the output unescaped:\n%q", out)
	}
}

func TestStats(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	if out := mustRun(t, d.URL, "stats"); out != "no events\n" {
		t.Errorf("stats on an empty table: %q", out)
	}
	seed(t, d.Pool, "done", "evt_done_", 4, time.Hour)
	seed(t, d.Pool, "failed", "evt_failed_", 2, time.Hour)
	seed(t, d.Pool, "in_progress", "evt_busy_", 1, 3*time.Hour)
	if _, err := d.Pool.Exec(t.Context(), "UPDATE txhook_processed_events SET source = 'github' WHERE event_key = 'evt_done_4'"); err != nil {
		t.Fatal(err)
	}
	out := mustRun(t, d.URL, "stats")
	want := regexp.MustCompile(`(?s)^SOURCE\s+QUEUED\s+IN PROGRESS\s+DONE\s+FAILED\s+TOTAL\s*\n` +
		`github\s+0\s+0\s+1\s+0\s+1\s*\n` +
		`stripe\s+0\s+1\s+3\s+2\s+6\s*\n` +
		`\(all\)\s+0\s+1\s+4\s+2\s+7\s*\n\n` +
		`failed events: 2 \(txhook dead-letters\)\n` +
		`oldest in-progress lease: stripe evt_busy_1, claimed 3h0m\d+s ago \(attempt 1\), lease expired 2h59m\d+s ago\n` +
		`inbox queue: empty\n$`)
	if !want.MatchString(out) {
		t.Errorf("stats printed:\n%s", out)
	}
	var s txhook.Stats
	if err := json.Unmarshal([]byte(mustRun(t, d.URL, "stats", "--json")), &s); err != nil {
		t.Fatal(err)
	}
	if s.Total != 7 || s.Failed != 2 || s.OldestInProgress == nil || s.OldestInProgress.Key != "evt_busy_1" {
		t.Errorf("stats --json = %+v", s)
	}
}

func TestPrune(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	seed(t, d.Pool, "done", "evt_old_", 5, 20*24*time.Hour)
	seed(t, d.Pool, "failed", "evt_oldfail_", 2, 20*24*time.Hour)
	seed(t, d.Pool, "done", "evt_new_", 3, 24*time.Hour)
	seed(t, d.Pool, "in_progress", "evt_busy_", 2, 20*24*time.Hour)

	out := mustRun(t, d.URL, "prune", "--older-than", "14d", "--dry-run")
	if !strings.HasPrefix(out, "would delete 5 done events completed before ") {
		t.Errorf("dry run printed %q", out)
	}
	if n := count(t, d.Pool, "true"); n != 12 {
		t.Fatalf("dry run deleted rows: %d left", n)
	}

	code, out, errOut := txhookCLI(t, "--database-url", d.URL, "prune", "--older-than", "14d", "--batch", "2")
	if code != 0 || !regexp.MustCompile(`^deleted 5 done events completed before \S+ in 3 batches \(.*rows/s\)\n$`).MatchString(out) || errOut != "" {
		t.Errorf("prune: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if count(t, d.Pool, "starts_with(event_key, 'evt_old_')") != 0 || count(t, d.Pool, "true") != 7 {
		t.Errorf("after prune: %d rows left, want 7", count(t, d.Pool, "true"))
	}

	for _, tc := range []struct {
		args []string
		warn bool
	}{
		{[]string{"--older-than", "7d"}, true},
		{[]string{"--older-than", "7d", "--body-dedupe-window", "0"}, false},
		{[]string{"--older-than", "20d", "--body-dedupe-window", "30d"}, true},
		{[]string{"--older-than", "30d", "--body-dedupe-window", "30d"}, false},
	} {
		args := append([]string{"--database-url", d.URL, "prune", "--dry-run"}, tc.args...)
		code, _, errOut := txhookCLI(t, args...)
		if code != 0 || strings.Contains(errOut, "shorter than the body dedupe window") != tc.warn {
			t.Errorf("prune %v: exit %d, stderr %q; want a body dedupe window warning: %v", tc.args, code, errOut, tc.warn)
		}
	}
	if code, _, errOut := txhookCLI(t, "--database-url", d.URL, "prune", "--body-dedupe-window", "36500d2562047h"); code != 2 || !strings.Contains(errOut, "--body-dedupe-window") {
		t.Errorf("prune with an overflowing --body-dedupe-window: exit %d, stderr %q", code, errOut)
	}

	code, out, errOut = txhookCLI(t, "--database-url", d.URL, "prune", "--older-than", "12h", "--include-failed")
	if code != 0 || !strings.HasPrefix(out, "deleted 5 done and failed events") || !strings.Contains(errOut, "warning: a retention of 12h0m0s is shorter") ||
		!strings.Contains(errOut, "shorter than the body dedupe window of 336h0m0s") {
		t.Errorf("prune --older-than 12h: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if n := count(t, d.Pool, "status = 'in_progress'"); n != 2 || count(t, d.Pool, "true") != 2 {
		t.Errorf("in-progress rows = %d of %d left, want only the 2 in-progress rows", n, count(t, d.Pool, "true"))
	}
}

func TestParseAge(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{
		"14d": 14 * 24 * time.Hour, "36h": 36 * time.Hour, "1d12h": 36 * time.Hour, "90m": 90 * time.Minute, "0d": 0,
		"36500d": 36500 * 24 * time.Hour, "2562047h": 2562047 * time.Hour,
	} {
		if got, err := parseAge(in); err != nil || got != want {
			t.Errorf("parseAge(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "d", "-1d", "-3h", "1d-3h", "14 days", "1.5d", "99999999d",
		// Each part fits a time.Duration; their sum does not.
		"36500d2562047h", "1d2562047h", "36500d9223372036854775807ns"} {
		if got, err := parseAge(in); err == nil {
			t.Errorf("parseAge(%q) = %v, want an error", in, got)
		}
	}
	now := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"2d":                   now.Add(-48 * time.Hour),
		"2026-03-01":           time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC),
		"2026-03-01T10:00:00Z": time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC),
	} {
		if got, err := parseSince(in, now); err != nil || !got.Equal(want) {
			t.Errorf("parseSince(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	// An overflowing age would put --since in the future and list nothing.
	if got, err := parseSince("36500d2562047h", now); err == nil {
		t.Errorf("parseSince(36500d2562047h) = %v, want an error", got)
	}
}

func TestPruneWhileAnotherPrunerRuns(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	seed(t, d.Pool, "done", "evt_old_", 3, 20*24*time.Hour)
	tx, err := d.Pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(t.Context(), "SELECT pg_advisory_xact_lock($1)", int64(0x7478686f6f6b5052) /* the pruners lock */); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := txhookCLI(t, "--database-url", d.URL, "prune")
	if code != 0 || out != "deleted 0 done events\n" || !strings.Contains(errOut, "another pruner holds the pruning lock") {
		t.Errorf("prune while locked: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if n := count(t, d.Pool, "true"); n != 3 {
		t.Errorf("%d rows left, want 3", n)
	}
}
