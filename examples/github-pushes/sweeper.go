package main

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

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

// newSweeper returns the redelivery sweeper of c's hook, for the events of
// source github.
func newSweeper(pool *pgxpool.Pool, c sweeperConfig, log *slog.Logger) (*ghsweep.Sweeper, error) {
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
	return sw, nil
}

// startSweeper runs sw every interval on a ticker in a goroutine, in sync
// mode, where there is no River client, and returns a function that waits
// for it to stop once ctx ends. Several instances of the example may each
// run one: the sweeper's advisory lock makes their runs take turns.
func startSweeper(ctx context.Context, sw *ghsweep.Sweeper, interval time.Duration) (wait func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		sw.RunEvery(ctx, interval)
	}()
	return func() { <-done }
}

// sweepQueue is the River queue of the sweeper's job: one at a time in a
// process.
const sweepQueue = "github_redeliver"

// sweepArgs are the arguments of the River job that runs the sweeper once.
type sweepArgs struct{}

// Kind is River's name for the job.
func (sweepArgs) Kind() string { return "github_redeliver" }

// InsertOpts puts the job in its queue and tries it once: the next
// periodic run is its retry.
func (sweepArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: sweepQueue, MaxAttempts: 1}
}

// sweepWorker runs the sweeper once per job.
type sweepWorker struct {
	river.WorkerDefaults[sweepArgs]
	sw *ghsweep.Sweeper
}

// Work runs one sweep; the sweeper logs its result.
func (w *sweepWorker) Work(ctx context.Context, _ *river.Job[sweepArgs]) error {
	_, err := w.sw.Run(ctx)
	return err
}

// Timeout leaves a sweep's bound to the sweeper's own RunTimeout (which
// records a sweep it cuts short as such), not to the inbox's job timeout:
// a sweep pauses between redelivery requests.
func (w *sweepWorker) Timeout(*river.Job[sweepArgs]) time.Duration { return -1 }

// addSweepJob registers sw on rc, the inbox's River configuration, as a
// periodic job run every interval and once when the client starts (or
// becomes River's leader). River inserts periodic jobs on its elected
// leader only; two instances running a sweep at once anyway (a new leader's
// run on start, a sweep outlasting the interval) are kept apart by the
// sweeper's advisory lock: the second run finds it held and does nothing.
func addSweepJob(rc *river.Config, sw *ghsweep.Sweeper, interval time.Duration) error {
	if rc.Workers == nil {
		rc.Workers = river.NewWorkers()
	}
	if err := river.AddWorkerSafely(rc.Workers, &sweepWorker{sw: sw}); err != nil {
		return fmt.Errorf("add sweeper worker: %w", err)
	}
	if rc.Queues == nil {
		rc.Queues = make(map[string]river.QueueConfig)
	}
	rc.Queues[sweepQueue] = river.QueueConfig{MaxWorkers: 1}
	rc.PeriodicJobs = append(rc.PeriodicJobs, river.NewPeriodicJob(
		river.PeriodicInterval(interval),
		func() (river.JobArgs, *river.InsertOpts) { return sweepArgs{}, nil },
		&river.PeriodicJobOpts{ID: "github_redeliver", RunOnStart: true},
	))
	return nil
}
