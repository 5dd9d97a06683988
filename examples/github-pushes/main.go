// Command github-pushes receives GitHub push webhooks and records each
// delivery exactly once in PostgreSQL with txhook.
//
// It applies txhook's migrations, River's and its own (pushes,
// repositories), then serves POST /webhooks/github. A push delivery is
// recorded in pushes and counted in its repository's row, in the
// transaction that settles the delivery's key (X-GitHub-Delivery, which
// GitHub keeps when a delivery is redelivered). A ping is answered 200;
// other event types are acknowledged and nothing is written.
//
// GitHub never retries a failed delivery by itself, so the example runs in
// txhook's inbox mode (package inbox) by default: a verified push is stored
// with a River job and answered 202 {"status":"queued"} once both are
// committed; River's workers, in this process, apply it (retrying a failed
// handler with River's backoff, rescuing the job of a killed process). With
// APPLY_MODE=sync the push is applied before the answer (200
// {"status":"processed"}), and a failure is GitHub's to redeliver.
//
// GitHub signs neither X-GitHub-Delivery nor a timestamp, so txhook's body
// dedupe is on: a captured body sent again under a fresh delivery id is
// answered duplicate_body and logged. GitHub does not retry failed
// deliveries by itself: with GITHUB_HOOK_ID set, the example runs txhook's
// redelivery sweeper (package ghsweep) every REDELIVER_INTERVAL, which asks
// GitHub to redeliver the failed deliveries of the last 3 days whose
// delivery id is not yet recorded (see docs/github-sweeper.md). In inbox
// mode the sweep is a River periodic job on the inbox's client, run once at
// start and then every REDELIVER_INTERVAL; River's leader inserts it, and
// the sweeper's advisory lock keeps two sweeps from running at once. In
// sync mode, which has no River client, a ticker runs it in this process
// (every instance may run one: the lock makes their runs take turns).
//
// Configuration, from the environment:
//
//	DATABASE_URL           PostgreSQL connection string (required)
//	GITHUB_WEBHOOK_SECRET  the webhook's secret (required; several,
//	                       comma-separated, while rotating it)
//	ADDR                   listen address (default 127.0.0.1:8081)
//	APPLY_MODE             inbox (default) or sync
//	INBOX_JOB_TIMEOUT      bounds one try of a push's job; the job of a
//	                       killed process is rescued twice that long after
//	                       its try began (default 1m)
//	FAIL_FIRST_TRY         a commit id (after): the first try of that push
//	                       fails in this process, for demonstrations
//	TRY_DELAY              each try of a push waits this long before its
//	                       writes (default 0), for demonstrations: a crash
//	                       in the job then comes after the delivery's 202
//	TXHOOK_CRASH_POINT     makes the process exit at a crash point, for crash tests
//
// The redelivery sweeper, off when GITHUB_HOOK_ID is unset:
//
//	GITHUB_HOOK_ID         the repository webhook's id
//	GITHUB_REPOSITORY      the repository, OWNER/NAME
//	GITHUB_TOKEN           a token with the Webhooks permission (read and
//	                       write) on the repository
//	GITHUB_API_URL         the REST API (default https://api.github.com)
//	REDELIVER_INTERVAL     time between sweeps (default 5m)
//	REDELIVER_PAUSE        least time between two redelivery requests
//	                       (default 1s, GitHub's advice; 0 for none)
//	REDELIVER_BACKOFF      wait before asking again for a delivery whose
//	                       redelivery failed too, doubled each time (default 1m)
//
// Once it is ready it logs a line with msg=listening and the address.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/txhook/txhook"
	examplemigrations "github.com/txhook/txhook/examples/github-pushes/migrations"
	"github.com/txhook/txhook/examples/github-pushes/pushesdb"
	"github.com/txhook/txhook/ghsweep"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/inbox"
	"github.com/txhook/txhook/migrations"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(ctx, os.Getenv, log); err != nil {
		fmt.Fprintln(os.Stderr, "github-pushes:", err)
		os.Exit(1)
	}
}

// config is the example's configuration, read from the environment.
type config struct {
	DatabaseURL   string        // DATABASE_URL
	WebhookSecret []string      // GITHUB_WEBHOOK_SECRET, comma-separated
	Addr          string        // ADDR, default 127.0.0.1:8081
	Sync          bool          // APPLY_MODE=sync; default inbox
	JobTimeout    time.Duration // INBOX_JOB_TIMEOUT, default 1m
	FailFirstTry  string        // FAIL_FIRST_TRY
	TryDelay      time.Duration // TRY_DELAY
	Sweeper       sweeperConfig
}

// loadConfig reads the configuration through getenv; its error names every
// missing setting.
func loadConfig(getenv func(string) string) (config, error) {
	c := config{
		DatabaseURL: strings.TrimSpace(getenv("DATABASE_URL")),
		Addr:        strings.TrimSpace(getenv("ADDR")),
	}
	for s := range strings.SplitSeq(getenv("GITHUB_WEBHOOK_SECRET"), ",") {
		if s = strings.TrimSpace(s); s != "" {
			c.WebhookSecret = append(c.WebhookSecret, s)
		}
	}
	if c.Addr == "" {
		c.Addr = "127.0.0.1:8081"
	}
	c.FailFirstTry = strings.TrimSpace(getenv("FAIL_FIRST_TRY"))
	var problems []string
	switch m := strings.TrimSpace(getenv("APPLY_MODE")); m {
	case "", "inbox":
	case "sync":
		c.Sync = true
	default:
		problems = append(problems, fmt.Sprintf("APPLY_MODE must be inbox or sync, got %q", m))
	}
	if v := strings.TrimSpace(getenv("TRY_DELAY")); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			problems = append(problems, fmt.Sprintf("TRY_DELAY must be a duration such as 300ms, got %q", v))
		}
		c.TryDelay = d
	}
	c.JobTimeout = inbox.DefaultJobTimeout
	if v := strings.TrimSpace(getenv("INBOX_JOB_TIMEOUT")); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			problems = append(problems, fmt.Sprintf("INBOX_JOB_TIMEOUT must be a positive duration such as 30s, got %q", v))
		}
		c.JobTimeout = d
	}
	if c.DatabaseURL == "" {
		problems = append(problems, "DATABASE_URL is required: the PostgreSQL connection string, e.g. postgres://app@127.0.0.1:5432/app")
	}
	if len(c.WebhookSecret) == 0 {
		problems = append(problems, "GITHUB_WEBHOOK_SECRET is required: the secret set on the GitHub webhook")
	}
	var sp []string
	c.Sweeper, sp = loadSweeperConfig(getenv)
	problems = append(problems, sp...)
	if len(problems) > 0 {
		return config{}, errors.New("invalid configuration:\n  - " + strings.Join(problems, "\n  - "))
	}
	return c, nil
}

// run starts the server and serves until ctx ends.
func run(ctx context.Context, getenv func(string) string, log *slog.Logger) error {
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	pool, err := openDatabase(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	h, ib, err := newHandler(pool, cfg, log)
	if err != nil {
		return err
	}
	if ib != nil {
		// Not ended by the signal (that would cancel the running jobs at
		// once): Stop below drains them.
		if err := ib.Start(context.WithoutCancel(ctx)); err != nil {
			return err
		}
		defer func() {
			// Graceful shutdown: running jobs finish (or, past the bound,
			// are cancelled and applied by the next run).
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := ib.Stop(sctx); err != nil {
				log.Error("stop inbox", "err", err)
			}
		}()
	}
	if cfg.Sweeper.on() {
		runs := "river periodic job"
		if cfg.Sync {
			runs = "ticker"
			sw, err := newSweeper(pool, cfg.Sweeper, log)
			if err != nil {
				return err
			}
			sctx, stopSweeper := context.WithCancel(ctx)
			defer startSweeper(sctx, sw, cfg.Sweeper.Interval)()
			defer stopSweeper()
		}
		log.Info("redelivery sweeper on", "hook", ghsweep.RepoHook(cfg.Sweeper.Owner, cfg.Sweeper.Repo, cfg.Sweeper.HookID).String(),
			"every", cfg.Sweeper.Interval, "as", runs)
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Addr, err)
	}
	// Bound every phase of a connection: an unsigned request costs memory
	// and a connection until it is answered. WriteTimeout runs from the end
	// of the headers to the end of the answer, so it must exceed the
	// slowest delivery (GitHub itself waits 10s).
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	log.Info("listening", "addr", ln.Addr().String(), "endpoint", "POST /webhooks/github")
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shut down: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// openDatabase connects and applies txhook's migrations, then the
// example's own.
func openDatabase(ctx context.Context, dbURL string) (*pgxpool.Pool, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return nil, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to the database (DATABASE_URL): %w", err)
	}
	if err := migrations.Up(ctx, dbURL); err != nil {
		pool.Close()
		return nil, fmt.Errorf("apply txhook migrations: %w", err)
	}
	if err := inbox.Migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, fmt.Errorf("apply river migrations: %w", err)
	}
	if err := examplemigrations.Up(ctx, dbURL); err != nil {
		pool.Close()
		return nil, fmt.Errorf("apply github-pushes migrations: %w", err)
	}
	return pool, nil
}

// newHandler returns POST /webhooks/github applying push deliveries through
// a txhook processor on pool: through the inbox it returns too (not yet
// started, with the redelivery sweeper's periodic job when cfg.Sweeper is
// on), or, with cfg.Sync, before the answer (a nil inbox).
func newHandler(pool *pgxpool.Pool, cfg config, log *slog.Logger) (http.Handler, *inbox.Inbox, error) {
	apply := txhook.WithQueries(pushesdb.New, push)
	if cfg.FailFirstTry != "" {
		apply = failFirstTry(cfg.FailFirstTry, apply)
	}
	if cfg.TryDelay > 0 {
		apply = delayTries(cfg.TryDelay, apply)
	}
	// The one route, registered once: applied by the inbox's job, or during
	// the delivery with cfg.Sync.
	routes := txhook.NewRoutes()
	if cfg.Sync {
		routes.Transactional("github", "push", apply)
	} else {
		routes.Inbox("github", "push", apply)
	}
	proc, err := txhook.NewProcessor(pool, &txhook.Config{Routes: routes, Logger: log})
	if err != nil {
		return nil, nil, fmt.Errorf("new processor: %w", err)
	}
	var ib *inbox.Inbox
	if !cfg.Sync {
		rc := &river.Config{JobTimeout: cfg.JobTimeout, Logger: log}
		if cfg.Sweeper.on() {
			sw, err := newSweeper(pool, cfg.Sweeper, log)
			if err != nil {
				return nil, nil, err
			}
			if err := addSweepJob(rc, sw, cfg.Sweeper.Interval); err != nil {
				return nil, nil, err
			}
		}
		ib, err = inbox.New(pool, proc, &inbox.Config{River: rc}) // the processor's queue
		if err != nil {
			return nil, nil, err
		}
	}
	ep, err := handler.New(proc, &handler.Config{
		Source:   "github",
		Provider: &handler.GitHub{Secrets: cfg.WebhookSecret},
		Logger:   log,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("new endpoint: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /webhooks/github", ep)
	return mux, ib, nil
}
