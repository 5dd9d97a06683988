package main

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook/ghsweep"
)

// sweeperConfig is the redelivery sweeper's part of the configuration. The
// sweeper is off when GITHUB_HOOK_ID is unset.
type sweeperConfig struct {
	HookID   int64         // GITHUB_HOOK_ID
	Owner    string        // GITHUB_REPOSITORY, OWNER/NAME
	Repo     string        //
	Token    string        // GITHUB_TOKEN
	APIURL   string        // GITHUB_API_URL, default https://api.github.com
	Interval time.Duration // REDELIVER_INTERVAL, default 5m
	Pause    time.Duration // REDELIVER_PAUSE, default 1s
	Backoff  time.Duration // REDELIVER_BACKOFF, default 1m
}

// on reports whether the sweeper is configured.
func (c sweeperConfig) on() bool { return c.HookID != 0 }

// loadSweeperConfig reads the sweeper's settings and returns what is wrong
// with them.
func loadSweeperConfig(getenv func(string) string) (sweeperConfig, []string) {
	c := sweeperConfig{
		Token:    strings.TrimSpace(getenv("GITHUB_TOKEN")),
		APIURL:   strings.TrimSpace(getenv("GITHUB_API_URL")),
		Interval: 5 * time.Minute,
		Pause:    time.Second,
		Backoff:  time.Minute,
	}
	hookID := strings.TrimSpace(getenv("GITHUB_HOOK_ID"))
	if hookID == "" {
		return sweeperConfig{}, nil
	}
	var problems []string
	id, err := strconv.ParseInt(hookID, 10, 64)
	if err != nil || id <= 0 {
		problems = append(problems, fmt.Sprintf("GITHUB_HOOK_ID must be the webhook's numeric id, got %q", hookID))
	}
	c.HookID = id
	repo := strings.TrimSpace(getenv("GITHUB_REPOSITORY"))
	owner, name, ok := strings.Cut(repo, "/")
	if !ok || owner == "" || name == "" || strings.Contains(name, "/") {
		problems = append(problems, fmt.Sprintf("GITHUB_REPOSITORY must be OWNER/NAME when GITHUB_HOOK_ID is set, got %q", repo))
	}
	c.Owner, c.Repo = owner, name
	if c.Token == "" {
		problems = append(problems, "GITHUB_TOKEN is required when GITHUB_HOOK_ID is set: a token with the Webhooks permission (read and write) on the repository")
	}
	if c.APIURL == "" {
		c.APIURL = "https://api.github.com"
	}
	for _, d := range []struct {
		name string
		dst  *time.Duration
		min  time.Duration
	}{{"REDELIVER_INTERVAL", &c.Interval, time.Second}, {"REDELIVER_PAUSE", &c.Pause, 0}, {"REDELIVER_BACKOFF", &c.Backoff, time.Millisecond}} {
		if v := strings.TrimSpace(getenv(d.name)); v != "" {
			dur, err := time.ParseDuration(v)
			if err != nil || dur < d.min {
				problems = append(problems, fmt.Sprintf("%s must be a duration of at least %s, e.g. 5m, got %q", d.name, d.min, v))
			}
			*d.dst = dur
		}
	}
	return c, problems
}

// startSweeper starts the redelivery sweeper on a ticker in a goroutine
// and returns a function that waits for it to stop once ctx ends. Several
// instances of the example may each run one: the sweeper's advisory lock
// makes their runs take turns.
func startSweeper(ctx context.Context, pool *pgxpool.Pool, c sweeperConfig, log *slog.Logger) (wait func(), err error) {
	pause := c.Pause
	if pause == 0 {
		pause = -1 // ghsweep: no pause
	}
	sw, err := ghsweep.New(pool, &ghsweep.Config{
		Hook:      ghsweep.RepoHook(c.Owner, c.Repo, c.HookID),
		Token:     c.Token,
		Source:    "github",
		APIURL:    c.APIURL,
		PostPause: pause,
		Backoff:   c.Backoff,
		Logger:    log,
	})
	if err != nil {
		return nil, fmt.Errorf("new redelivery sweeper: %w", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sw.RunEvery(ctx, c.Interval)
	}()
	log.Info("redelivery sweeper on", "hook", ghsweep.RepoHook(c.Owner, c.Repo, c.HookID).String(), "every", c.Interval)
	return func() { <-done }, nil
}
