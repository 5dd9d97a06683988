// Package crash proves the core claim with real process deaths: the process
// applying an event is killed (os.Exit at a crash point) between the key
// insert and COMMIT, and at every other fault point; after a restart and a
// redelivery, the event's effect exists exactly once. The same test against
// the naive dedupe (key committed alone, then the work) shows the event lost,
// which proves the test can detect a loss.
package crash

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/db"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/txhooktest"
)

// childEnv selects the child mode of this test binary.
const childEnv = "TXHOOK_CRASHTEST_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(child(mode))
	}
	testdb.Main(m)
}

// schema is the business side: an order row and a running total that is not
// idempotent on its own (applying the event twice doubles it).
const schema = `
CREATE TABLE orders (id text PRIMARY KEY, amount bigint NOT NULL);
CREATE TABLE totals (customer text PRIMARY KEY, spent bigint NOT NULL);
CREATE TABLE naive_processed_events (event_key text PRIMARY KEY);`

func apply(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
	return applyTo(ctx, tx, tx, ev)
}

// applyDeferred is apply with the total's update deferred (txhook.Deferred):
// it travels with COMMIT.
func applyDeferred(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
	return applyTo(ctx, tx, txhook.Deferred(tx), ev)
}

// applyOneTrip defers both writes: under DedupeWithFirstStatement they
// travel with BEGIN, the dedupe step and COMMIT, one round trip.
func applyOneTrip(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
	later := txhook.Deferred(tx)
	return applyTo(ctx, later, later, ev)
}

// applyTo inserts the order through first and updates the total through
// later.
func applyTo(ctx context.Context, first, later db.DBTX, ev txhook.Event) error {
	if _, err := first.Exec(ctx, "INSERT INTO orders (id, amount) VALUES ($1, 500)", "order-"+ev.Key); err != nil {
		return err
	}
	_, err := later.Exec(ctx, `INSERT INTO totals (customer, spent) VALUES ('cus_1', 500)
		ON CONFLICT (customer) DO UPDATE SET spent = totals.spent + 500`)
	return err
}

// child processes one event and prints its outcome. TXHOOK_CRASH_POINT makes
// it die on the way.
func child(mode string) int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	ev := txhook.Event{Source: "crash-test", Key: "evt_crash", Type: "checkout.session.completed"}
	var outcome string
	switch mode {
	case "txhook", "txhook-first", "txhook-deferred", "txhook-one-trip", "txhook-wrapped":
		// txhook-first sends the dedupe step with the handler's first
		// statement; txhook-deferred also defers its second statement to
		// COMMIT; txhook-one-trip defers both, which then travel with the
		// dedupe step and COMMIT; txhook-wrapped runs on a database
		// wrapper that cannot pipeline.
		var d txhook.Beginner = pool
		if mode == "txhook-wrapped" {
			d = onlyBegins{pool}
		}
		p, err := txhook.NewProcessor(d, &txhook.Config{DedupeWithFirstStatement: mode == "txhook-first" || mode == "txhook-deferred" || mode == "txhook-one-trip"})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		h := apply
		switch mode {
		case "txhook-deferred":
			h = applyDeferred
		case "txhook-one-trip":
			h = applyOneTrip
		}
		res, err := p.Process(ctx, ev, h)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		outcome = res.Outcome.String()
	case "naive":
		outcome, err = naive(ctx, pool, ev)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	default:
		return 2
	}
	fmt.Println(outcome)
	return 0
}

// onlyBegins is a database wrapper that only begins transactions, as an
// instrumented wrapper may: a Processor on it takes the path for databases
// that cannot pipeline.
type onlyBegins struct{ pool *pgxpool.Pool }

func (w onlyBegins) BeginTx(ctx context.Context, o pgx.TxOptions) (pgx.Tx, error) {
	return w.pool.BeginTx(ctx, o)
}

// naive is the dedupe most receivers copy: commit the key, then do the work
// in a second transaction. It honours the same crash points.
func naive(ctx context.Context, pool *pgxpool.Pool, ev txhook.Event) (string, error) {
	crashAt := func(p txhooktest.CrashPoint) {
		if os.Getenv(txhooktest.CrashPointEnv) == string(p) {
			os.Exit(txhooktest.CrashExitCode)
		}
	}
	tag, err := pool.Exec(ctx, "INSERT INTO naive_processed_events VALUES ($1) ON CONFLICT DO NOTHING", ev.Key)
	if err != nil {
		return "", err
	}
	if tag.RowsAffected() == 0 {
		return "duplicate", nil
	}
	crashAt(txhooktest.CrashAfterInsert)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := apply(ctx, tx, ev); err != nil {
			return err
		}
		crashAt(txhooktest.CrashAfterHandler)
		crashAt(txhooktest.CrashBeforeCommit)
		return nil
	})
	if err != nil {
		return "", err
	}
	crashAt(txhooktest.CrashAfterCommit)
	return "processed", nil
}

// run starts this test binary in child mode and returns its exit code and
// standard output.
func run(t *testing.T, dbURL, mode string, crashPoint txhooktest.CrashPoint) (int, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode, "DATABASE_URL="+dbURL, txhooktest.CrashPointEnv+"="+string(crashPoint))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return 0, strings.TrimSpace(stdout.String())
	case errors.As(err, &exitErr):
		if exitErr.ExitCode() != txhooktest.CrashExitCode {
			t.Logf("child stderr: %s", stderr.String())
		}
		return exitErr.ExitCode(), strings.TrimSpace(stdout.String())
	}
	t.Fatalf("run child: %v", err)
	return 0, ""
}

type state struct{ orders, spent int }

func readState(t *testing.T, pool *pgxpool.Pool) state {
	t.Helper()
	var s state
	err := pool.QueryRow(t.Context(),
		"SELECT (SELECT count(*) FROM orders), COALESCE((SELECT spent FROM totals WHERE customer = 'cus_1'), 0)").
		Scan(&s.orders, &s.spent)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var crashPoints = []txhooktest.CrashPoint{
	txhooktest.CrashAfterInsert,
	txhooktest.CrashAfterHandler,
	txhooktest.CrashBeforeCommit,
	txhooktest.CrashAfterCommit,
}

func TestCrashThenRedeliveryAppliesOnce(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"txhook", "txhook-first", "txhook-deferred", "txhook-one-trip", "txhook-wrapped"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			crashThenRedeliver(t, mode)
		})
	}
}

func crashThenRedeliver(t *testing.T, mode string) {
	for _, cp := range crashPoints {
		t.Run(string(cp), func(t *testing.T) {
			t.Parallel()
			d := testdb.New(t)
			if _, err := d.Pool.Exec(t.Context(), schema); err != nil {
				t.Fatal(err)
			}
			if code, _ := run(t, d.URL, mode, cp); code != txhooktest.CrashExitCode {
				t.Fatalf("first delivery exited %d, want the crash exit %d", code, txhooktest.CrashExitCode)
			}
			// Restarted without the crash point, the provider redelivers.
			code, out := run(t, d.URL, mode, "")
			if code != 0 {
				t.Fatalf("redelivery exited %d", code)
			}
			want := "processed"
			if cp == txhooktest.CrashAfterCommit || (mode == "txhook-one-trip" && cp == txhooktest.CrashAfterInsert) {
				// It committed before the process died (in one round
				// trip, the insert is known only with COMMIT's answer).
				want = "duplicate"
			}
			if out != want {
				t.Errorf("redelivery outcome = %q, want %q", out, want)
			}
			// And once more, as providers do.
			if _, out := run(t, d.URL, mode, ""); out != "duplicate" {
				t.Errorf("third delivery outcome = %q, want duplicate", out)
			}
			if s := readState(t, d.Pool); s != (state{orders: 1, spent: 500}) {
				t.Errorf("state = %+v, want exactly one order and 500 spent", s)
			}
		})
	}
}

// The naive dedupe, killed between its key insert and the work, loses the
// event: every redelivery is answered "duplicate" and the order never exists.
// This is the loss txhook prevents, and proof that the test above would see
// one.
func TestNaiveDedupeLosesEventOnCrash(t *testing.T) {
	t.Parallel()
	for _, cp := range []txhooktest.CrashPoint{txhooktest.CrashAfterInsert, txhooktest.CrashBeforeCommit} {
		t.Run(string(cp), func(t *testing.T) {
			t.Parallel()
			d := testdb.New(t)
			if _, err := d.Pool.Exec(t.Context(), schema); err != nil {
				t.Fatal(err)
			}
			if code, _ := run(t, d.URL, "naive", cp); code != txhooktest.CrashExitCode {
				t.Fatalf("first delivery exited %d, want the crash exit", code)
			}
			code, out := run(t, d.URL, "naive", "")
			if code != 0 || out != "duplicate" {
				t.Fatalf("redelivery = %d %q, want the naive receiver to answer duplicate", code, out)
			}
			if s := readState(t, d.Pool); s != (state{}) {
				t.Errorf("state = %+v, want the event lost (no order)", s)
			}
		})
	}
}

// Without a crash, the naive receiver works: the loss above is the crash's.
func TestNaiveDedupeWithoutCrash(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	if _, err := d.Pool.Exec(t.Context(), schema); err != nil {
		t.Fatal(err)
	}
	if _, out := run(t, d.URL, "naive", ""); out != "processed" {
		t.Fatalf("outcome = %q, want processed", out)
	}
	if s := readState(t, d.Pool); s != (state{orders: 1, spent: 500}) {
		t.Errorf("state = %+v", s)
	}
}
