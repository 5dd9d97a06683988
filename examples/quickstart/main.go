// Command quickstart receives Stripe and GitHub webhooks and applies each
// event exactly once to PostgreSQL with txhook: the README's quickstart.
package main

import (
	"cmp"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/migrations"

	"github.com/txhook/txhook/examples/quickstart/mydb" // your sqlc output: your module's path + "/mydb"
)

// ownMigrations are the application's migrations, applied at start-up
// after txhook's.
//
//go:embed migrations/*.sql
var ownMigrations embed.FS

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		log.Fatal(err)
	}
}

// run applies the migrations and serves the webhooks until ctx ends.
func run(ctx context.Context) error {
	dbURL := os.Getenv("DATABASE_URL")
	if dbURL == "" {
		return errors.New("DATABASE_URL is not set")
	}
	// txhook's schema, recorded in its own table (txhook_schema_migrations),
	// then the application's, recorded in another: each evolves on its own,
	// and both are safe when several instances start at once.
	if err := migrations.Up(ctx, dbURL); err != nil {
		return fmt.Errorf("apply txhook's migrations: %w", err)
	}
	own, err := fs.Sub(ownMigrations, "migrations")
	if err != nil {
		return fmt.Errorf("read the application's migrations: %w", err)
	}
	if err := migrations.UpFS(ctx, dbURL, own, "app_schema_migrations"); err != nil {
		return fmt.Errorf("apply the application's migrations: %w", err)
	}

	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("open the database: %w", err)
	}
	defer pool.Close()

	// Every handler is registered once, by source and event type; the
	// endpoints (and a replay of a dead letter) find it here. Other types
	// are answered 200 "ignored".
	routes := txhook.NewRoutes()
	routes.Transactional("stripe", "checkout.session.completed", txhook.WithQueries(mydb.New, onCheckout))
	routes.Transactional("github", "push", txhook.WithQueries(mydb.New, onPush))
	proc, err := txhook.NewProcessor(pool, &txhook.Config{Routes: routes})
	if err != nil {
		return fmt.Errorf("new processor: %w", err)
	}
	stripe, err := handler.New(proc, &handler.Config{
		Source:   "stripe",
		Provider: &handler.Stripe{Secrets: []string{os.Getenv("STRIPE_WEBHOOK_SECRET")}},
	})
	if err != nil {
		return fmt.Errorf("stripe endpoint (STRIPE_WEBHOOK_SECRET): %w", err)
	}
	github, err := handler.New(proc, &handler.Config{
		Source:   "github",
		Provider: &handler.GitHub{Secrets: []string{os.Getenv("GITHUB_WEBHOOK_SECRET")}},
	})
	if err != nil {
		return fmt.Errorf("github endpoint (GITHUB_WEBHOOK_SECRET): %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /webhooks/stripe", stripe)
	mux.Handle("POST /webhooks/github", github)

	srv := &http.Server{ // every phase of a connection bounded: unsigned requests cost memory too
		Addr:              cmp.Or(os.Getenv("ADDR"), "127.0.0.1:8080"),
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second, // longer than your slowest handler
		IdleTimeout:       2 * time.Minute,
	}
	ln, err := net.Listen("tcp", srv.Addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Printf("listening on %s", ln.Addr())
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done(): // SIGINT or SIGTERM
	}
	// Take no new deliveries and let the running ones commit and be answered.
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shut down: %w", err)
	}
	log.Print("stopped")
	return nil
}

// onCheckout records a paid Checkout Session: its order, and its amount
// added to the customer's total. It runs in the transaction that records the
// event's key, through the application's own queries: every write commits
// with the key, or not at all.
func onCheckout(ctx context.Context, q *mydb.Queries, ev txhook.Event) error {
	var e struct {
		Data struct {
			Object struct {
				ID          string `json:"id"`
				Customer    string `json:"customer"`
				AmountTotal int64  `json:"amount_total"`
			} `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(ev.Payload, &e); err != nil {
		// Can never succeed: recorded as failed (a dead letter), Stripe told to stop.
		return txhook.Permanent(fmt.Errorf("decode checkout session: %w", err))
	}
	s := e.Data.Object
	if s.ID == "" || s.Customer == "" {
		return txhook.Permanent(errors.New("checkout session without id or customer"))
	}
	n, err := q.InsertOrder(ctx, mydb.InsertOrderParams{ID: s.ID, CustomerID: s.Customer, Amount: s.AmountTotal})
	if err != nil {
		return fmt.Errorf("insert order: %w", err)
	}
	if n == 0 {
		return nil // the session's order is already recorded: nothing to add
	}
	if err := q.AddCustomerSpend(ctx, mydb.AddCustomerSpendParams{ID: s.Customer, Amount: s.AmountTotal}); err != nil {
		return fmt.Errorf("add customer spend: %w", err)
	}
	return nil
}

// onPush counts a push to its repository, in the transaction that records
// the delivery's key.
func onPush(ctx context.Context, q *mydb.Queries, ev txhook.Event) error {
	var e struct {
		Repository struct {
			FullName string `json:"full_name"`
		} `json:"repository"`
	}
	if err := json.Unmarshal(ev.Payload, &e); err != nil {
		return txhook.Permanent(fmt.Errorf("decode push: %w", err))
	}
	if e.Repository.FullName == "" {
		return txhook.Permanent(errors.New("push without repository"))
	}
	if err := q.CountPush(ctx, e.Repository.FullName); err != nil {
		return fmt.Errorf("count push: %w", err)
	}
	return nil
}
