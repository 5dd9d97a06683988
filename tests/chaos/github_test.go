package main

import (
	"testing"
	"time"

	"github.com/txhook/txhook/internal/testdb"
)

// TestGitHubChaosShort is a short run of the never-retrying sender: a fake
// GitHub delivers 150 pushes once each to github-pushes, killed three
// times (once more while the sweeper recovers) and PostgreSQL restarted
// when the test owns the server; its redelivery sweeper must recover every
// failed delivery, and each push must be applied exactly once.
func TestGitHubChaosShort(t *testing.T) {
	db := testdb.New(t)
	cfg := defaultGitHubConfig()
	cfg.DatabaseURL = db.URL
	cfg.Pushes = 150
	cfg.Senders = 4
	cfg.Rate = 50
	cfg.Kills = 2
	cfg.SweepKills = 1
	cfg.Interval = time.Second
	cfg.Timeout = 3 * time.Minute
	cfg.Seed = uint64(time.Now().UnixNano())
	cfg.Log = t.Logf
	if c := testdb.Cluster(t); c != nil {
		cfg.RestartDB = c.Restart
	}
	res, err := runGitHub(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res.summary())
	for _, p := range res.Problems {
		t.Log("problem:", p)
	}
	if !res.ok() {
		t.Fatalf("seed %d: lost=%d duplicated=%d", cfg.Seed, res.Lost, res.Duplicated)
	}
	if res.Kills < cfg.Kills {
		t.Errorf("kills = %d, want at least %d", res.Kills, cfg.Kills)
	}
	if res.FirstTryFail == 0 || res.Redelivered == 0 {
		t.Errorf("%d deliveries failed and %d pushes were redelivered: the kills caused no failure to recover, the run proves nothing", res.FirstTryFail, res.Redelivered)
	}
	if res.Redelivered > res.FirstTryFail {
		t.Errorf("%d pushes redelivered, more than the %d that failed", res.Redelivered, res.FirstTryFail)
	}
}
