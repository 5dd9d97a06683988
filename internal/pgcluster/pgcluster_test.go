package pgcluster

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestRestartNeedsDurableCommits: a cluster started without durable commits
// refuses to restart, and goes on serving.
func TestRestartNeedsDurableCommits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Start(ctx)
	if errors.Is(err, ErrNoServer) && os.Getenv("CI") == "" {
		t.Skip(err) // as testdb does: skipped locally, failed under CI
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	if err := c.Restart(ctx); !errors.Is(err, ErrNotDurable) {
		t.Fatalf("restart of a cluster started with Start = %v, want ErrNotDurable", err)
	}
	if out, err := c.run(ctx, "pg_ctl", "-D", filepath.Join(c.dir, "data"), "status"); err != nil {
		t.Fatalf("the cluster stopped: %v: %s", err, out)
	}
}
