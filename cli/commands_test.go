package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/internal/testdb"
)

// runWith runs the command line in-process with stdin, an interactive flag
// and a configuration.
func runWith(t *testing.T, e env, cfg *Config, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	e.stdout, e.stderr = &out, &errOut
	if e.stdin == nil {
		e.stdin = strings.NewReader("")
	}
	code = run(t.Context(), args, e, cfg)
	return code, out.String(), errOut.String()
}

func TestMigrateDownAllAsksFirst(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	tableExists := func() bool {
		var ok bool
		if err := d.Pool.QueryRow(t.Context(), "SELECT to_regclass('txhook_processed_events') IS NOT NULL").Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	args := []string{"--database-url", d.URL, "migrate", "down", "--all"}

	// No terminal to ask on: refused, with the flag that confirms.
	code, _, errOut := runWith(t, env{}, nil, args...)
	if code != 2 || !strings.Contains(errOut, "add --yes to confirm") || !tableExists() {
		t.Errorf("down --all without a terminal: exit %d, %q, table exists %v; want 2, a hint, the table kept", code, errOut, tableExists())
	}
	// A terminal, and an answer other than yes: nothing changes.
	code, _, errOut = runWith(t, env{interactive: true, stdin: strings.NewReader("y\n")}, nil, args...)
	if code != 1 || !strings.Contains(errOut, "Type yes to go on") || !strings.Contains(errOut, "not confirmed") || !tableExists() {
		t.Errorf("down --all answered y: exit %d, %q, table exists %v", code, errOut, tableExists())
	}
	// yes: the tables go.
	code, _, errOut = runWith(t, env{interactive: true, stdin: strings.NewReader("yes\n")}, nil, args...)
	if code != 0 || tableExists() {
		t.Errorf("down --all answered yes: exit %d, %q, table exists %v", code, errOut, tableExists())
	}
	mustRun(t, d.URL, "migrate", "up")
	if code, _, errOut := runWith(t, env{}, nil, append(args, "--yes")...); code != 0 || tableExists() {
		t.Errorf("down --all --yes: exit %d, %q, table exists %v", code, errOut, tableExists())
	}
}

func TestMissingTableSaysMigrateUp(t *testing.T) {
	t.Parallel()
	empty := testdb.Template{Name: "empty", Migrate: func(context.Context, string) error { return nil }}
	d := testdb.New(t, empty)
	for _, args := range [][]string{{"events", "list"}, {"stats"}, {"dead-letters"}, {"prune"}} {
		code, _, errOut := runWith(t, env{}, &Config{Name: "app txhook"}, append([]string{"--database-url", d.URL}, args...)...)
		if code != 1 || !strings.HasSuffix(errOut, "txhook's tables do not exist in this database: run app txhook migrate up\n") || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v on an empty database: exit %d, stderr %q; want one line saying to run migrate up", args, code, errOut)
		}
	}
}

// replayFixture is a database with dead letters and the handlers that replay
// them into a ledger table.
type replayFixture struct {
	db  *testdb.DB
	cfg *Config
}

func newReplayFixture(t *testing.T) *replayFixture {
	t.Helper()
	d := testdb.New(t)
	if _, err := d.Pool.Exec(t.Context(), "CREATE TABLE ledger (event_key text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	seed(t, d.Pool, "failed", "evt_failed_", 3, time.Hour) // stripe, invoice.paid, payload {"id":...}
	if _, err := d.Pool.Exec(t.Context(), `
		INSERT INTO txhook_processed_events (source, event_key, event_type, status, completed_at, last_error, payload)
		VALUES ('github', 'gh_1', 'push', 'failed', now(), 'permanent: boom', NULL),
		       ('stripe', 'evt_bad', 'invoice.paid', 'failed', now(), 'permanent: bad', convert_to('{"bad":true}', 'UTF8'))`); err != nil {
		t.Fatal(err)
	}
	handler := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		if strings.Contains(string(ev.Payload), "bad") {
			return txhook.Permanent(fmt.Errorf("still bad"))
		}
		_, err := tx.Exec(ctx, "INSERT INTO ledger (event_key) VALUES ($1)", ev.Key)
		return err
	}
	cfg := &Config{
		Name: "app txhook",
		NewProcessor: func(ctx context.Context, pool *pgxpool.Pool) (*txhook.Processor, error) {
			routes := txhook.NewRoutes()
			routes.Transactional("stripe", "invoice.paid", handler)
			return txhook.NewProcessor(pool, &txhook.Config{Routes: routes})
		},
	}
	return &replayFixture{db: d, cfg: cfg}
}

func (f *replayFixture) run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return runWith(t, env{progressEvery: time.Hour}, f.cfg, append([]string{"--database-url", f.db.URL}, args...)...)
}

func TestDeadLetters(t *testing.T) {
	t.Parallel()
	f := newReplayFixture(t)
	code, out, errOut := f.run(t, "dead-letters", "--source", "stripe")
	if code != 0 || errOut != "" {
		t.Fatalf("dead-letters: exit %d, %q", code, errOut)
	}
	lines := strings.Split(out, "\n")
	if !strings.HasPrefix(lines[0], "SOURCE  KEY") || strings.Contains(out, "gh_1") ||
		!strings.Contains(out, "evt_failed_1") || !strings.Contains(out, "evt_bad") ||
		!strings.Contains(out, "4 dead letters shown, oldest first. Replay one: app txhook replay SOURCE KEY") {
		t.Errorf("dead-letters --source stripe:\n%s", out)
	}
	var evs []txhook.EventRecord
	code, out, _ = f.run(t, "dead-letters", "--json", "--limit", "2")
	if err := json.Unmarshal([]byte(out), &evs); code != 0 || err != nil || len(evs) != 2 || evs[0].Status != "failed" {
		t.Errorf("dead-letters --json --limit 2: exit %d, %v, %+v", code, err, evs)
	}
}

func (f *replayFixture) ledger(t *testing.T) int {
	t.Helper()
	var n int
	if err := f.db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM ledger").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestReplay(t *testing.T) {
	t.Parallel()
	f := newReplayFixture(t)

	// Dry run: lists, changes nothing, needs no handlers.
	code, out, errOut := runWith(t, env{}, nil, "--database-url", f.db.URL, "replay", "--all", "--dry-run")
	if code != 0 || !strings.Contains(out, "would replay stripe evt_failed_1 (invoice.paid") ||
		!strings.Contains(out, "cannot replay github gh_1 (push): payload not stored") ||
		!strings.HasSuffix(out, "would replay 4 of 5 dead letters\n") {
		t.Errorf("replay --all --dry-run: exit %d, %q\n%s", code, errOut, out)
	}
	if n := count(t, f.db.Pool, "status = 'failed'"); n != 5 || f.ledger(t) != 0 {
		t.Fatalf("dry run changed something: %d failed", n)
	}

	// Without the application's handlers: one line saying where replay runs.
	code, _, errOut = runWith(t, env{}, nil, "--database-url", f.db.URL, "replay", "stripe", "evt_failed_1")
	if code != 2 || !strings.Contains(errOut, "replay runs the application's handlers, which txhook does not have") || strings.Count(errOut, "\n") != 1 {
		t.Errorf("replay in the txhook binary: exit %d, %q", code, errOut)
	}

	// One event.
	code, out, errOut = f.run(t, "replay", "stripe", "evt_failed_1")
	if code != 0 || out != "replayed stripe evt_failed_1: processed\n" || errOut != "" {
		t.Errorf("replay one: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, _, errOut = f.run(t, "replay", "stripe", "evt_failed_1")
	if code != 1 || !strings.Contains(errOut, "is done, neither failed nor stuck: nothing to replay") || f.ledger(t) != 1 {
		t.Errorf("replay of a done event: exit %d, %q, ledger %d", code, errOut, f.ledger(t))
	}
	// A queued event is its job's to apply; a lease-mode claim abandoned in
	// progress (its lease ended) is stuck, and would be taken over.
	seed(t, f.db.Pool, "queued", "evt_queued_", 1, time.Minute)
	seed(t, f.db.Pool, "in_progress", "evt_abandoned_", 1, time.Hour)
	code, _, errOut = f.run(t, "replay", "stripe", "evt_queued_1")
	if code != 1 || !strings.Contains(errOut, "is queued, neither failed nor stuck: nothing to replay") {
		t.Errorf("replay of a queued event: exit %d, %q", code, errOut)
	}
	code, out, errOut = f.run(t, "replay", "--dry-run", "stripe", "evt_abandoned_1")
	if code != 0 || !strings.Contains(out, "would replay stripe evt_abandoned_1 (invoice.paid, 1 attempt, stuck in_progress)") ||
		!strings.HasSuffix(out, "would replay 1 of 1 dead letter\n") {
		t.Errorf("replay --dry-run of a stuck event: exit %d, %q, %q", code, out, errOut)
	}

	// Every dead letter of a source.
	code, out, errOut = f.run(t, "replay", "--all", "--source", "stripe")
	for _, want := range []string{
		"replayed stripe evt_failed_2: processed\n", "replayed stripe evt_failed_3: processed\n",
		"replayed stripe evt_bad: failed again, still a dead letter: permanent: still bad\n",
		"2 of 3 dead letters processed, 1 failed again, 0 not replayed\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("replay --all --source stripe lacks %q:\n%s", want, out)
		}
	}
	if code != 1 || !strings.Contains(errOut, "1 of 3 events not processed") {
		t.Errorf("replay --all with a failure: exit %d, %q", code, errOut)
	}
	if n := f.ledger(t); n != 3 {
		t.Errorf("ledger rows = %d, want 3 (each replayed event once)", n)
	}
	if n := count(t, f.db.Pool, "status = 'failed'"); n != 2 {
		t.Errorf("failed events left = %d, want 2 (evt_bad and the github one)", n)
	}
}

func TestProgressOfLongCommands(t *testing.T) {
	t.Parallel()
	f := newReplayFixture(t)
	seed(t, f.db.Pool, "done", "evt_old_", 5, 20*24*time.Hour)
	// progressEvery 0: a line after every step, on stderr (not a terminal).
	code, _, errOut := runWith(t, env{}, f.cfg, "--database-url", f.db.URL, "prune", "--batch", "2")
	if code != 0 || !regexp.MustCompile(`(?m)^app txhook prune: deleted 2 rows so far, \d+ rows/s\napp txhook prune: deleted 4 rows so far`).MatchString(errOut) {
		t.Errorf("prune progress: exit %d, stderr:\n%s", code, errOut)
	}
	code, _, errOut = runWith(t, env{}, f.cfg, "--database-url", f.db.URL, "replay", "--all", "--source", "stripe", "--type", "invoice.paid")
	if code != 1 || !strings.Contains(errOut, "app txhook replay: replayed 1 of about 4 events (25%)") || !strings.Contains(errOut, "replayed 4 of about 4 events (100%)") {
		t.Errorf("replay progress: exit %d, stderr:\n%s", code, errOut)
	}
}

// A lease-mode replay that cannot claim its event (another transaction holds
// the row past the processor's lock timeout) is in flight: not replayed, and
// the command fails.
func TestReplayInFlight(t *testing.T) {
	t.Parallel()
	f := newReplayFixture(t)
	ran := false
	lh := txhook.LeaseHandler{Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
		ran = true
		return nil, nil
	}}
	cfg := &Config{
		Name: "app txhook",
		NewProcessor: func(ctx context.Context, pool *pgxpool.Pool) (*txhook.Processor, error) {
			routes := txhook.NewRoutes()
			routes.Lease("stripe", "", lh)
			return txhook.NewProcessor(pool, &txhook.Config{Routes: routes, LockTimeout: 50 * time.Millisecond})
		},
	}
	tx, err := f.db.Pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(t.Context(), `SELECT 1 FROM txhook_processed_events
		WHERE source = 'stripe' AND event_key = 'evt_failed_1' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := runWith(t, env{progressEvery: time.Hour}, cfg, "--database-url", f.db.URL, "replay", "stripe", "evt_failed_1")
	if code != 1 || out != "not replayed stripe evt_failed_1: another replay or delivery holds the event; try again\n" ||
		!strings.Contains(errOut, "1 of 1 event not processed") {
		t.Errorf("replay of a held event: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, _ = runWith(t, env{progressEvery: time.Hour}, cfg, "--database-url", f.db.URL, "replay", "--all", "--source", "stripe", "--type", "invoice.paid", "--limit", "1")
	if code != 1 || !strings.Contains(out, "0 of 1 dead letter processed, 0 failed again, 1 not replayed\n") {
		t.Errorf("replay --all of a held event: exit %d, stdout %q", code, out)
	}
	if ran {
		t.Error("the handler ran for a held event")
	}
	if err := tx.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := count(t, f.db.Pool, "status = 'failed'"); n != 5 {
		t.Errorf("failed events = %d, want 5 (nothing replayed)", n)
	}
}
