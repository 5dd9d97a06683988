package migrations_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/migrations"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// emptyDB returns a database with no schema at all.
func emptyDB(t *testing.T) *testdb.DB {
	t.Helper()
	return testdb.New(t, testdb.Template{
		Name:    "empty",
		Migrate: func(context.Context, string) error { return nil },
	})
}

func tableExists(t *testing.T, d *testdb.DB, name string) bool {
	t.Helper()
	var ok bool
	if err := d.Pool.QueryRow(t.Context(), "SELECT to_regclass($1) IS NOT NULL", name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestUpDownVersion(t *testing.T) {
	t.Parallel()
	d := emptyDB(t)
	ctx := t.Context()
	latest, err := migrations.Latest()
	if err != nil || latest == 0 {
		t.Fatalf("Latest = %d, %v", latest, err)
	}
	if v, dirty, err := migrations.Version(ctx, d.URL); err != nil || v != 0 || dirty {
		t.Fatalf("Version before Up = %d, %v, %v; want 0", v, dirty, err)
	}
	for range 2 { // the second Up finds nothing to do
		if err := migrations.Up(ctx, d.URL); err != nil {
			t.Fatal(err)
		}
	}
	if v, dirty, err := migrations.Version(ctx, d.URL); err != nil || v != latest || dirty {
		t.Fatalf("Version after Up = %d, %v, %v; want %d", v, dirty, err, latest)
	}
	if !tableExists(t, d, "txhook_processed_events") || !tableExists(t, d, migrations.TableName) {
		t.Fatal("Up did not create the events table and its own migrations table")
	}
	if err := migrations.Down(ctx, d.URL, 0); err != nil {
		t.Fatal(err)
	}
	if tableExists(t, d, "txhook_processed_events") {
		t.Error("Down left the events table")
	}
	if err := migrations.Up(ctx, d.URL); err != nil {
		t.Fatalf("Up after Down: %v", err)
	}
}

func TestDownSteps(t *testing.T) {
	t.Parallel()
	d := emptyDB(t)
	ctx := t.Context()
	latest, _ := migrations.Latest()
	if latest < 2 {
		t.Skip("needs two migrations")
	}
	if err := migrations.Up(ctx, d.URL); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Down(ctx, d.URL, 1); err != nil {
		t.Fatal(err)
	}
	v, _, err := migrations.Version(ctx, d.URL)
	if err != nil || v >= latest || v == 0 {
		t.Errorf("Version after Down 1 = %d, %v; want between 0 and %d", v, err, latest)
	}
}

// Several instances starting at once all succeed and apply each migration once.
func TestConcurrentUp(t *testing.T) {
	t.Parallel()
	d := emptyDB(t)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() { errs <- migrations.Up(context.Background(), d.URL) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("concurrent Up: %v", err)
		}
	}
	latest, _ := migrations.Latest()
	if v, dirty, err := migrations.Version(t.Context(), d.URL); err != nil || v != latest || dirty {
		t.Errorf("Version = %d, %v, %v; want %d clean", v, dirty, err, latest)
	}
}

// The application's own golang-migrate table is left alone.
func TestCoexistsWithApplicationMigrations(t *testing.T) {
	t.Parallel()
	d := emptyDB(t)
	ctx := t.Context()
	if _, err := d.Pool.Exec(ctx, `CREATE TABLE schema_migrations (version bigint PRIMARY KEY, dirty boolean NOT NULL);
		INSERT INTO schema_migrations VALUES (20240101, false)`); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Up(ctx, d.URL); err != nil {
		t.Fatal(err)
	}
	var v int64
	if err := d.Pool.QueryRow(ctx, "SELECT version FROM schema_migrations").Scan(&v); err != nil || v != 20240101 {
		t.Errorf("application's schema_migrations = %d, %v; want untouched", v, err)
	}
}

// A URL written for pgxpool, with pool settings, works for migrations too.
func TestUpAcceptsPoolSettingsInURL(t *testing.T) {
	t.Parallel()
	d := emptyDB(t)
	sep := "?"
	if strings.Contains(d.URL, "?") {
		sep = "&"
	}
	if err := migrations.Up(t.Context(), d.URL+sep+"pool_max_conns=20&pool_min_conns=1"); err != nil {
		t.Fatal(err)
	}
	if !tableExists(t, d, "txhook_processed_events") {
		t.Error("Up did not apply the migrations")
	}
}

func TestUpRejectsBadURL(t *testing.T) {
	if err := migrations.Up(context.Background(), ""); err == nil {
		t.Error("empty URL accepted")
	}
	if err := migrations.Up(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=2"); err == nil {
		t.Error("unreachable database accepted")
	}
	if err := migrations.Up(context.Background(), "postgres://x@127.0.0.1/db?pool_max_conns=many"); err == nil {
		t.Error("malformed URL accepted")
	}
}

// An application's own migrations run through UpFS with their own table,
// independently of txhook's.
func TestUpFSAppliesApplicationMigrations(t *testing.T) {
	t.Parallel()
	d := emptyDB(t)
	ctx := t.Context()
	app := fstest.MapFS{
		"0001_widgets.up.sql":   {Data: []byte("CREATE TABLE widgets (id int PRIMARY KEY);")},
		"0001_widgets.down.sql": {Data: []byte("DROP TABLE widgets;")},
	}
	if err := migrations.UpFS(ctx, d.URL, app, ""); err == nil {
		t.Error("empty table name accepted")
	}
	for range 2 {
		if err := migrations.UpFS(ctx, d.URL, app, "app_schema_migrations"); err != nil {
			t.Fatal(err)
		}
	}
	if !tableExists(t, d, "widgets") || !tableExists(t, d, "app_schema_migrations") {
		t.Fatal("UpFS did not apply the application's migration into its own table")
	}
	if tableExists(t, d, migrations.TableName) {
		t.Error("UpFS touched txhook's migrations table")
	}
	if err := migrations.Up(ctx, d.URL); err != nil {
		t.Fatal(err)
	}
	if v, _, err := migrations.Version(ctx, d.URL); err != nil || v == 0 {
		t.Errorf("txhook version = %d, %v after the application's migrations", v, err)
	}
}

// TestPayloadCompression: 0014 compresses new payloads with lz4 (on a server
// built with it), and its down migration returns to the server's default.
func TestPayloadCompression(t *testing.T) {
	t.Parallel()
	d := emptyDB(t)
	ctx := t.Context()
	if err := migrations.Up(ctx, d.URL); err != nil {
		t.Fatal(err)
	}
	var lz4 bool
	if err := d.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals))`).Scan(&lz4); err != nil {
		t.Fatal(err)
	}
	compression := func() string {
		t.Helper()
		var c string
		if err := d.Pool.QueryRow(ctx, `SELECT attcompression::text FROM pg_attribute
			WHERE attrelid = 'txhook_processed_events'::regclass AND attname = 'payload'`).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	want := "l"
	if !lz4 {
		want = ""
	}
	if got := compression(); got != want {
		t.Fatalf("payload compression %q after Up, want %q (lz4 available: %v)", got, want, lz4)
	}
	big := make([]byte, 8000)
	for i := range big {
		big[i] = byte('a' + i%7)
	}
	if _, err := d.Pool.Exec(ctx, `INSERT INTO txhook_processed_events (source, event_key, status, completed_at, payload)
		VALUES ('s', 'k', 'done', now(), $1)`, big); err != nil {
		t.Fatal(err)
	}
	latest, err := migrations.Latest()
	if err != nil {
		t.Fatal(err)
	}
	steps := int(latest) - 13 // down to before 0014
	if err := migrations.Down(ctx, d.URL, steps); err != nil {
		t.Fatalf("Down %d: %v", steps, err)
	}
	if got := compression(); got != "" {
		t.Errorf("payload compression %q after 0014's down migration, want the default", got)
	}
	var n int
	if err := d.Pool.QueryRow(ctx, `SELECT length(payload) FROM txhook_processed_events WHERE event_key = 'k'`).Scan(&n); err != nil || n != len(big) {
		t.Errorf("payload written under lz4 read back as %d bytes, %v; want %d", n, err, len(big))
	}
}

// TestRowCheck: the events table refuses a row that breaks any of the four
// rules of its row check (0016), on insert and on update, and takes the rows
// txhook writes; 0016's down migration puts back the four constraints it
// replaced, which refuse the same rows.
func TestRowCheck(t *testing.T) {
	t.Parallel()
	d := emptyDB(t)
	ctx := t.Context()
	if err := migrations.Up(ctx, d.URL); err != nil {
		t.Fatal(err)
	}
	good := []string{
		`('s', 'done', 'done', 1, now(), NULL)`,
		`('s', 'failed', 'failed', 1, now(), NULL)`,
		`('s', 'queued', 'queued', 1, NULL, NULL)`,
		`('s', 'claimed', 'in_progress', 3, NULL, now())`,
	}
	bad := map[string]string{
		"an unknown status":             `('s', 'x', 'bogus', 1, now(), NULL)`,
		"no attempt":                    `('s', 'x', 'done', 0, now(), NULL)`,
		"a claim without a lease":       `('s', 'x', 'in_progress', 1, NULL, NULL)`,
		"a done event without its time": `('s', 'x', 'done', 1, NULL, NULL)`,
		"a failure without its time":    `('s', 'x', 'failed', 1, NULL, NULL)`,
	}
	const insert = `INSERT INTO txhook_processed_events (source, event_key, status, attempts, completed_at, lease_expires_at) VALUES `
	check := func(stage string) {
		t.Helper()
		for _, row := range good {
			if _, err := d.Pool.Exec(ctx, insert+row); err != nil {
				t.Errorf("%s: %s refused: %v", stage, row, err)
			}
		}
		for what, row := range bad {
			_, err := d.Pool.Exec(ctx, insert+row)
			if pe, ok := errors.AsType[*pgconn.PgError](err); !ok || pe.Code != "23514" {
				t.Errorf("%s: %s (%s) answered %v, want a check violation (23514)", stage, what, row, err)
			}
		}
		// An update is checked too: a done event's time taken away.
		_, err := d.Pool.Exec(ctx, `UPDATE txhook_processed_events SET completed_at = NULL WHERE event_key = 'done'`)
		if pe, ok := errors.AsType[*pgconn.PgError](err); !ok || pe.Code != "23514" {
			t.Errorf("%s: update of a done event's time to NULL answered %v, want a check violation (23514)", stage, err)
		}
		if _, err := d.Pool.Exec(ctx, `DELETE FROM txhook_processed_events`); err != nil {
			t.Fatal(err)
		}
	}
	check("after Up")
	var valid bool
	if err := d.Pool.QueryRow(ctx, `SELECT convalidated FROM pg_constraint WHERE conname = 'txhook_processed_events_row_check'`).Scan(&valid); err != nil || !valid {
		t.Errorf("row check validated = %v, %v after Up; want validated", valid, err)
	}
	latest, err := migrations.Latest()
	if err != nil {
		t.Fatal(err)
	}
	if steps := int(latest) - 15; steps > 0 {
		if err := migrations.Down(ctx, d.URL, steps); err != nil {
			t.Fatalf("Down %d: %v", steps, err)
		}
	}
	check("after 0016's down migration")
}

// TestIndexMigrationsKeepRows applies migrations 0018-0022 (indexes built
// and dropped CONCURRENTLY) to a table that holds rows of every status,
// then rolls them back: each time the table has the expected indexes, all
// valid, and each partial index holds the rows its predicate names.
func TestIndexMigrationsKeepRows(t *testing.T) {
	t.Parallel()
	d := emptyDB(t)
	ctx := t.Context()
	if err := migrations.Up(ctx, d.URL); err != nil {
		t.Fatal(err)
	}
	latest, err := migrations.Latest()
	if err != nil {
		t.Fatal(err)
	}
	before := int(latest) - 17 // down to 0017: the three indexes of 0004 and 0006
	if err := migrations.Down(ctx, d.URL, before); err != nil {
		t.Fatalf("Down %d: %v", before, err)
	}
	if _, err := d.Pool.Exec(ctx, `INSERT INTO txhook_processed_events
		(source, event_key, status, attempts, completed_at, lease_expires_at)
		SELECT 's', 'k' || i || '-' || s.n, s.status, 1,
		       CASE WHEN s.status IN ('done', 'failed') THEN now() END,
		       CASE WHEN s.status = 'in_progress' THEN now() END
		FROM generate_series(1, 50) AS i,
		     unnest(ARRAY['done', 'done', 'done', 'failed', 'queued', 'in_progress']) WITH ORDINALITY AS s(status, n)`); err != nil {
		t.Fatal(err)
	}
	// The rows a partial index holds, as ANALYZE counts them: the rows of its
	// table that satisfy its predicate (the sample is the whole table here).
	entries := func(index string) int64 {
		t.Helper()
		var n int64
		err := d.Pool.QueryRow(ctx, `SELECT reltuples::bigint FROM pg_class WHERE relname = $1`, index).Scan(&n)
		if err != nil {
			t.Fatalf("%s: %v", index, err)
		}
		return n
	}
	indexes := func(stage string, want map[string]int64) {
		t.Helper()
		rows, err := d.Pool.Query(ctx, `SELECT c.relname, i.indisvalid FROM pg_index AS i
			JOIN pg_class AS c ON c.oid = i.indexrelid
			WHERE i.indrelid = 'txhook_processed_events'::regclass AND NOT i.indisprimary
			  AND c.relname <> 'txhook_processed_events_payload_hash_idx'`)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		for rows.Next() {
			var name string
			var valid bool
			if err := rows.Scan(&name, &valid); err != nil {
				t.Fatal(err)
			}
			got[name] = valid
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Errorf("%s: indexes %v, want %v", stage, got, want)
		}
		if _, err := d.Pool.Exec(ctx, `ANALYZE txhook_processed_events`); err != nil {
			t.Fatal(err)
		}
		for name, n := range want {
			valid, ok := got[name]
			if !ok || !valid {
				t.Errorf("%s: index %s present %v, valid %v", stage, name, ok, valid)
				continue
			}
			if e := entries(name); e != n {
				t.Errorf("%s: %s holds %d rows, want %d", stage, name, e, n)
			}
		}
	}
	old := map[string]int64{
		"txhook_processed_events_completed_idx": 250, // done, failed and queued
		"txhook_processed_events_open_idx":      100, // failed and in progress
		"txhook_processed_events_queued_idx":    50,
	}
	indexes("at 0017", old)
	if err := migrations.Up(ctx, d.URL); err != nil {
		t.Fatalf("Up from 0017 with rows: %v", err)
	}
	indexes("after Up", map[string]int64{
		"txhook_processed_events_completed_at_idx": 200, // done and failed
		"txhook_processed_events_not_done_idx":     150, // failed, in progress and queued
	})
	if err := migrations.Down(ctx, d.URL, before); err != nil {
		t.Fatalf("Down %d with rows: %v", before, err)
	}
	indexes("down to 0017 again", old)
}
