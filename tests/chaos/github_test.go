package main

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	pushesmigrations "github.com/txhook/txhook/examples/github-pushes/migrations"
	"github.com/txhook/txhook/internal/testdb"
)

// TestGitHubChaosShort is a short run of the never-retrying sender: a fake
// GitHub delivers 150 pushes once each to github-pushes, killed three
// times (once more while the sweeper recovers) and PostgreSQL restarted
// once (on a durable cluster of the test's own); its redelivery sweeper
// must recover every failed delivery, and each push must be applied exactly
// once.
func TestGitHubChaosShort(t *testing.T) {
	c := durableCluster(t)
	cfg := defaultGitHubConfig()
	cfg.DatabaseURL, cfg.RestartDB = c.URL, c.Restart
	cfg.Pushes = 150
	cfg.Senders = 4
	cfg.Rate = 50
	cfg.Kills = 2
	cfg.SweepKills = 1
	cfg.Interval = time.Second
	cfg.Timeout = 3 * time.Minute
	cfg.Seed = uint64(time.Now().UnixNano())
	cfg.Log = t.Logf
	res, err := runGitHub(t.Context(), cfg)
	mustBeClean(t, cfg.Seed, res, res.Problems, err)
	if res.DBRestarts != 1 {
		t.Errorf("PostgreSQL restarted %d times, want once", res.DBRestarts)
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

// TestVerifyGitHubFindsLossAndDuplicates shows that the GitHub run's check
// can fail: a push whose key is missing is lost, and a repository counting
// a push twice is a duplicate.
func TestVerifyGitHubFindsLossAndDuplicates(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := t.Context()
	if err := pushesmigrations.Up(ctx, db.URL); err != nil {
		t.Fatal(err)
	}
	pushes := []push{{guid: "g1", repo: "o/r", after: "a1", commits: 1}, {guid: "g2", repo: "o/r", after: "a2", commits: 2}}
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO txhook_processed_events (source, event_key, status, completed_at) VALUES ('github', 'g1', 'done', now());
		INSERT INTO pushes (delivery_id, repository, ref, before_sha, after_sha, pusher, commit_count)
		VALUES ('g1', 'o/r', 'refs/heads/main', '0', 'a1', 'p', 1);
		INSERT INTO repositories (full_name, push_count, commit_count, last_ref, last_head_sha) VALUES ('o/r', 3, 4, 'refs/heads/main', 'a1');`)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var res githubResult
	if err := verifyGitHub(ctx, conn, pushes, &res); err != nil {
		t.Fatal(err)
	}
	if res.Lost != 1 || res.Duplicated != 1 || res.ok() {
		t.Fatalf("lost = %d, duplicated = %d, want 1 and 1; problems %q", res.Lost, res.Duplicated, res.Problems)
	}
}
