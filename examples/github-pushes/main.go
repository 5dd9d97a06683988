// Command github-pushes receives GitHub push webhooks and records each
// delivery exactly once in PostgreSQL with txhook.
//
// It applies txhook's migrations and its own (pushes, repositories), then
// serves POST /webhooks/github. A push delivery is recorded in pushes and
// counted in its repository's row, in the transaction that records the
// delivery's key (X-GitHub-Delivery, which GitHub keeps when a delivery is
// redelivered). A ping is answered 200; other event types are acknowledged
// and nothing is written.
//
// GitHub signs neither X-GitHub-Delivery nor a timestamp, so txhook's replay
// guard is on: a captured body replayed under a fresh delivery id is
// answered as a duplicate and logged. GitHub does not retry failed
// deliveries by itself: with GITHUB_HOOK_ID set, the example runs txhook's
// redelivery sweeper (package ghsweep) every REDELIVER_INTERVAL, which asks
// GitHub to redeliver the failed deliveries of the last 3 days whose
// delivery id is not yet recorded (see docs/github-sweeper.md).
//
// Configuration, from the environment:
//
//	DATABASE_URL           PostgreSQL connection string (required)
//	GITHUB_WEBHOOK_SECRET  the webhook's secret (required; several,
//	                       comma-separated, while rotating it)
//	ADDR                   listen address (default 127.0.0.1:8081)
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

	"github.com/txhook/txhook"
	examplemigrations "github.com/txhook/txhook/examples/github-pushes/migrations"
	"github.com/txhook/txhook/examples/github-pushes/pushesdb"
	"github.com/txhook/txhook/handler"
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
	DatabaseURL   string   // DATABASE_URL
	WebhookSecret []string // GITHUB_WEBHOOK_SECRET, comma-separated
	Addr          string   // ADDR, default 127.0.0.1:8081
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
	var problems []string
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
	h, err := newHandler(pool, cfg, log)
	if err != nil {
		return err
	}
	if cfg.Sweeper.on() {
		sctx, stopSweeper := context.WithCancel(ctx)
		wait, err := startSweeper(sctx, pool, cfg.Sweeper, log)
		if err != nil {
			stopSweeper()
			return err
		}
		defer wait()
		defer stopSweeper()
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
	if err := examplemigrations.Up(ctx, dbURL); err != nil {
		pool.Close()
		return nil, fmt.Errorf("apply github-pushes migrations: %w", err)
	}
	return pool, nil
}

// newHandler returns POST /webhooks/github applying push deliveries through
// a txhook processor on pool.
func newHandler(pool *pgxpool.Pool, cfg config, log *slog.Logger) (http.Handler, error) {
	proc, err := txhook.NewProcessor(pool, &txhook.Config{StorePayload: true})
	if err != nil {
		return nil, fmt.Errorf("new processor: %w", err)
	}
	ep, err := handler.New(proc, &handler.Config{
		Source:   "github",
		Provider: &handler.GitHub{Secrets: cfg.WebhookSecret},
		Routes: map[string]handler.Route{
			"push": handler.Tx(txhook.WithQueries(pushesdb.New, push)),
		},
		Logger: log,
	})
	if err != nil {
		return nil, fmt.Errorf("new endpoint: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /webhooks/github", ep)
	return mux, nil
}
