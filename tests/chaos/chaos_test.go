package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	examplemigrations "github.com/txhook/txhook/examples/stripe-orders/migrations"
	"github.com/txhook/txhook/internal/natsserver"
	"github.com/txhook/txhook/internal/pgcluster"
	"github.com/txhook/txhook/internal/rabbittest"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/txhooktest"
)

func TestMain(m *testing.M) { rabbittest.Main(m) }

// TestChaosShort is a short chaos run: a few hundred events with duplicates,
// five SIGKILLs of the example, a crash point armed on some restarts, a
// PostgreSQL restart (on a durable cluster of the test's own), and lease mode
// on; every event must be applied exactly once.
//
// The example holds a lease-mode claim for 30s, so a kill that lands during
// a payment intent's external call stalls that event for 30s: the share of
// payment intents is kept small, and only transactional crash points are
// armed (tests/leasecrash covers the lease-mode ones).
func TestChaosShort(t *testing.T) {
	c := durableCluster(t)
	cfg := defaultConfig()
	cfg.DatabaseURL, cfg.RestartDB = c.URL, c.Restart
	cfg.Events = 300
	cfg.Senders = 4
	cfg.Kills = 5
	cfg.Customers = 10
	cfg.LeaseRate = 0.05
	cfg.CrashPoints = []txhooktest.CrashPoint{txhooktest.CrashAfterInsert, txhooktest.CrashAfterHandler, txhooktest.CrashBeforeCommit, txhooktest.CrashAfterCommit}
	cfg.Timeout = 3 * time.Minute
	cfg.Seed = uint64(time.Now().UnixNano())
	cfg.Log = t.Logf
	res := runClean(t, cfg)
	if res.Kills != cfg.Kills {
		t.Errorf("kills = %d, want %d", res.Kills, cfg.Kills)
	}
	if res.Restarts < res.Kills {
		t.Errorf("restarts = %d, fewer than the %d kills", res.Restarts, res.Kills)
	}
	if res.DuplicatesInjected == 0 || res.Deliveries <= int64(res.Events) {
		t.Errorf("deliveries = %d with %d duplicates injected for %d events: no duplicates were sent", res.Deliveries, res.DuplicatesInjected, res.Events)
	}
	if res.DBRestarts != 1 {
		t.Errorf("PostgreSQL restarted %d times, want once", res.DBRestarts)
	}
}

// durableCluster starts a PostgreSQL cluster of t's own with durable
// commits, for a run that restarts it (pgcluster refuses to restart any
// other: its restart would lose commits it acknowledged), and stops it when
// t ends. It skips t (fails it under CI) when no server can be started.
func durableCluster(t *testing.T) *pgcluster.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.StartDurable(ctx)
	if errors.Is(err, pgcluster.ErrNoServer) && os.Getenv("CI") == "" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Log(err)
		}
	})
	return c
}

// TestChaosShortReceivers is a short chaos run against three processes of
// the example on one database, sent deliveries round robin: duplicates,
// retries and concurrent copies of an event meet in different processes,
// and the kills land on receivers drawn at random. Lease mode is off (a
// kill during a lease stalls its event for 30s; TestChaosShort covers it),
// and so is the PostgreSQL restart. Every event must be applied exactly
// once.
func TestChaosShortReceivers(t *testing.T) {
	db := testdb.New(t)
	cfg := defaultConfig()
	cfg.DatabaseURL = db.URL
	cfg.Receivers = 3
	cfg.Events = 500
	cfg.Senders = 6
	cfg.Kills = 9
	cfg.Customers = 10
	cfg.Fulfillment, cfg.LeaseRate = false, 0
	cfg.CrashPoints = []txhooktest.CrashPoint{txhooktest.CrashAfterInsert, txhooktest.CrashAfterHandler, txhooktest.CrashBeforeCommit, txhooktest.CrashAfterCommit}
	cfg.Timeout = 3 * time.Minute
	cfg.Seed = uint64(time.Now().UnixNano())
	cfg.Log = t.Logf
	res := runClean(t, cfg)
	if res.Kills != cfg.Kills || len(res.KillsPerReceiver) != cfg.Receivers {
		t.Errorf("kills = %d over %v, want %d over %d receivers", res.Kills, res.KillsPerReceiver, cfg.Kills, cfg.Receivers)
	}
	if res.Restarts < res.Kills {
		t.Errorf("restarts = %d, fewer than the %d kills", res.Restarts, res.Kills)
	}
	if res.DuplicatesInjected == 0 || res.Deliveries <= int64(res.Events) {
		t.Errorf("deliveries = %d with %d duplicates injected for %d events: no duplicates were sent", res.Deliveries, res.DuplicatesInjected, res.Events)
	}
}

// TestVerifyFindsLossAndDuplicates shows that the final check can fail: on
// a database where one acknowledged checkout has no key and no order and
// another was applied to its customer's total twice, it reports both.
func TestVerifyFindsLossAndDuplicates(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := t.Context()
	if err := examplemigrations.Up(ctx, db.URL); err != nil {
		t.Fatal(err)
	}
	tag := "tv"
	ev := func(i int, amount int64) *event {
		e := &event{id: fmt.Sprintf("evt_%s_%d", tag, i), kind: kindCheckout, object: fmt.Sprintf("cs_%s_%d", tag, i),
			customer: "cus_" + tag + "_0", amount: amount}
		e.acked.Store(true)
		return e
	}
	events := []*event{ev(1, 100), ev(2, 200), ev(3, 400)}
	// Events 1 and 2 committed, event 3 acknowledged but never committed,
	// and the total holds 100 + 200 + 200: event 2 applied twice. Sums
	// alone show only a shortfall (500 < 700); the per-event checks name
	// event 3.
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO txhook_processed_events (source, event_key, status, completed_at)
		VALUES ('stripe', 'evt_tv_1', 'done', now()), ('stripe', 'evt_tv_2', 'done', now());
		INSERT INTO orders (checkout_session_id, customer_id, amount_total) VALUES ('cs_tv_1', 'cus_tv_0', 100), ('cs_tv_2', 'cus_tv_0', 200);
		INSERT INTO customers (id, total_spent) VALUES ('cus_tv_0', 500);`)
	if err != nil {
		t.Fatal(err)
	}
	var res result
	if err := verify(ctx, db.URL, tag, events, nil, true, &res); err != nil {
		t.Fatal(err)
	}
	if res.Lost != 2 || res.Duplicated != 0 || !strings.Contains(strings.Join(res.Problems, "\n"), "evt_tv_3 was acknowledged") {
		t.Fatalf("lost = %d, duplicated = %d, want 2 (event 3 and the customer's total) and 0; problems %q", res.Lost, res.Duplicated, res.Problems)
	}

	// Now the total counts event 2 twice and event 3 is committed: a
	// duplicate and no loss.
	_, err = db.Pool.Exec(ctx, `
		INSERT INTO txhook_processed_events (source, event_key, status, completed_at) VALUES ('stripe', 'evt_tv_3', 'done', now());
		INSERT INTO orders (checkout_session_id, customer_id, amount_total) VALUES ('cs_tv_3', 'cus_tv_0', 400);
		UPDATE customers SET total_spent = 900 WHERE id = 'cus_tv_0';`)
	if err != nil {
		t.Fatal(err)
	}
	res = result{}
	if err := verify(ctx, db.URL, tag, events, nil, true, &res); err != nil {
		t.Fatal(err)
	}
	if res.Lost != 0 || res.Duplicated != 1 {
		t.Fatalf("lost = %d, duplicated = %d, want 0 and 1; problems %q", res.Lost, res.Duplicated, res.Problems)
	}
}

// TestChaosCatchesNaiveDedupe runs the chaos against the naive dedupe (the
// event id committed alone, then the work), killed twice and dying right
// after an id's commit on the next restarts: the run must report events
// lost, with real process deaths, or its green runs against txhook would
// prove nothing.
func TestChaosCatchesNaiveDedupe(t *testing.T) {
	// Every restart after a kill is armed, and the last kill usually leaves
	// new events to send, so a process dies between an id's commit and its
	// work. When the kills land so late that every event left was already
	// inserted (answered duplicate by the restarted process), nothing died
	// there and the run shows nothing: run it again, at most three times.
	var res result
	for try := 1; try <= 3; try++ {
		db := testdb.New(t)
		cfg := defaultConfig()
		cfg.Naive = true
		cfg.DatabaseURL = db.URL
		cfg.Events = 200
		cfg.Senders = 4
		cfg.Kills = 2
		cfg.Customers = 10
		cfg.CrashRate = 1
		cfg.CrashLimit = 4
		cfg.CrashPoints = []txhooktest.CrashPoint{txhooktest.CrashAfterInsert}
		cfg.Timeout = 2 * time.Minute
		cfg.Seed = uint64(time.Now().UnixNano())
		cfg.Log = t.Logf
		var err error
		res, err = run(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("try %d: %s", try, res.summary())
		if res.CrashExits > 0 || res.Lost > 0 {
			break
		}
	}
	if res.Lost < max(1, res.CrashExits) || res.ok() {
		t.Fatalf("lost = %d after %d deaths between an id's commit and its work, want at least one lost per death: %s",
			res.Lost, res.CrashExits, res.summary())
	}
}

// runClean runs cfg and fails the test unless every event was applied
// exactly once.
func runClean(t *testing.T, cfg config) result {
	t.Helper()
	res, err := run(t.Context(), cfg)
	mustBeClean(t, cfg.Seed, res, res.Problems, err)
	return res
}

// mustBeClean fails the test when a scenario run with seed returned err, or
// lost or duplicated an event; it logs the run's summary and problems.
func mustBeClean(t *testing.T, seed uint64, res outcome, problems []string, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res.summary())
	for _, p := range problems {
		t.Log("problem:", p)
	}
	if !res.ok() {
		t.Fatalf("seed %d: %s", seed, res.summary())
	}
}

// TestNATSChaosShort is a short run of the NATS scenario: 300 events
// published to the example's stream (some twice with the same id), the
// example SIGKILLed five times, nats-server restarted once and PostgreSQL
// (a durable cluster of the test's own) once; every event must be applied
// exactly once and every message acknowledged.
func TestNATSChaosShort(t *testing.T) {
	if _, err := natsserver.Bin(); err != nil {
		natsserver.Own(t) // skips, or fails under CI
	}
	c := durableCluster(t)
	cfg := defaultNATSConfig()
	cfg.DatabaseURL, cfg.RestartDB = c.URL, c.Restart
	cfg.Events = 300
	cfg.Kills = 5
	cfg.LateRetryRate = 0.05
	cfg.Timeout = 3 * time.Minute
	cfg.Seed = uint64(time.Now().UnixNano())
	cfg.Log = t.Logf
	res, err := runNATS(t.Context(), cfg)
	mustBeClean(t, cfg.Seed, res, res.Problems, err)
	if res.Kills != cfg.Kills || res.NATSRestarts != 1 || res.DBRestarts != 1 {
		t.Errorf("kills = %d, nats restarts = %d, database restarts = %d; want %d, 1 and 1", res.Kills, res.NATSRestarts, res.DBRestarts, cfg.Kills)
	}
	if res.Published <= res.Events || res.StreamMessages <= uint64(res.Events) {
		t.Errorf("%d messages published, %d stored, for %d events: no publisher retries reached the consumer", res.Published, res.StreamMessages, res.Events)
	}
}
