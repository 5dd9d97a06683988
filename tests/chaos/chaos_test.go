package main

import (
	"testing"
	"time"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// TestChaosShort is a short chaos run: a few hundred events with duplicates,
// five SIGKILLs of the example, a crash point armed on some restarts, a
// PostgreSQL restart when the test owns the server, and lease mode on; every
// event must be applied exactly once.
//
// The example holds a lease-mode claim for 30s, so a kill that lands during
// a payment intent's external call stalls that event for 30s: the share of
// payment intents is kept small, and only transactional crash points are
// armed (tests/leasecrash covers the lease-mode ones).
func TestChaosShort(t *testing.T) {
	db := testdb.New(t)
	cfg := defaultConfig()
	cfg.DatabaseURL = db.URL
	cfg.Events = 300
	cfg.Senders = 4
	cfg.Kills = 5
	cfg.Customers = 10
	cfg.LeaseRate = 0.05
	cfg.CrashPoints = []txhook.CrashPoint{txhook.CrashAfterInsert, txhook.CrashAfterHandler, txhook.CrashBeforeCommit, txhook.CrashAfterCommit}
	cfg.Timeout = 3 * time.Minute
	cfg.Seed = uint64(time.Now().UnixNano())
	cfg.Log = t.Logf
	if c := testdb.Cluster(t); c != nil {
		cfg.RestartDB = c.Restart
	}
	res, err := run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res.summary())
	for _, p := range res.Problems {
		t.Log("problem:", p)
	}
	if !res.ok() {
		t.Fatalf("seed %d: lost=%d duplicated=%d unacked=%d", cfg.Seed, res.Lost, res.Duplicated, res.Unacked)
	}
	if res.Kills != cfg.Kills {
		t.Errorf("kills = %d, want %d", res.Kills, cfg.Kills)
	}
	if res.Restarts < res.Kills {
		t.Errorf("restarts = %d, fewer than the %d kills", res.Restarts, res.Kills)
	}
	if res.DuplicatesInjected == 0 || res.Deliveries <= int64(res.Events) {
		t.Errorf("deliveries = %d with %d duplicates injected for %d events: no duplicates were sent", res.Deliveries, res.DuplicatesInjected, res.Events)
	}
}
