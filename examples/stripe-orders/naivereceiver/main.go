// Command naivereceiver is the dedupe that most webhook receivers copy, kept
// here to show how it loses events. Do not use it.
//
// It receives the same Stripe checkout.session.completed events as the
// stripe-orders example and makes the same writes, but dedupes the usual
// way: it inserts the event's id into naive_processed_events and commits
// that on its own, then does the work in a second transaction. When the
// process dies between the two, the id says "processed" for ever: every
// retry is answered 200 "already processed" and the order is never written.
//
// The demo (cmd/demo) runs it. Settings, from the environment: DATABASE_URL,
// STRIPE_WEBHOOK_SECRET, ADDR, and TXHOOK_CRASH_POINT, which makes the
// process exit at after-insert (the id is committed, the work has not run)
// or after-handler (the work ran, not committed), like txhook's crash
// points.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	ordersmigrations "github.com/txhook/txhook/examples/stripe-orders/migrations"
	"github.com/txhook/txhook/examples/stripe-orders/ordersdb"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/txhooktest"
)

// createTable is the naive dedupe's table.
const createTable = `CREATE TABLE IF NOT EXISTS naive_processed_events (
    event_id     text        PRIMARY KEY,
    processed_at timestamptz NOT NULL DEFAULT now()
)`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "naivereceiver:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	dbURL, secret := os.Getenv("DATABASE_URL"), os.Getenv("STRIPE_WEBHOOK_SECRET")
	if dbURL == "" || secret == "" {
		return errors.New("DATABASE_URL and STRIPE_WEBHOOK_SECRET are required")
	}
	addr := os.Getenv("ADDR")
	if addr == "" {
		addr = "127.0.0.1:8081"
	}
	if err := ordersmigrations.Up(ctx, dbURL); err != nil {
		return fmt.Errorf("apply stripe-orders migrations: %w", err)
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("open database: %w", err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, createTable); err != nil {
		return fmt.Errorf("create naive_processed_events: %w", err)
	}
	r := &receiver{
		pool:   pool,
		stripe: &handler.Stripe{Secrets: []string{secret}},
		crash:  txhooktest.CrashPoint(os.Getenv(txhooktest.CrashPointEnv)),
	}
	mux := http.NewServeMux()
	mux.Handle("POST /webhooks/stripe", r)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	slog.Info("listening", "addr", ln.Addr().String())
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

type receiver struct {
	pool   *pgxpool.Pool
	stripe *handler.Stripe
	crash  txhooktest.CrashPoint
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	if err := rc.stripe.Verify(r.Header, body, time.Now()); err != nil {
		http.Error(w, "bad signature", http.StatusBadRequest)
		return
	}
	var ev struct {
		ID   string `json:"id"`
		Type string `json:"type"`
		Data struct {
			Object struct {
				ID          string `json:"id"`
				Customer    string `json:"customer"`
				AmountTotal int64  `json:"amount_total"`
			} `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &ev); err != nil || ev.ID == "" {
		http.Error(w, "malformed event", http.StatusBadRequest)
		return
	}
	ctx := r.Context()

	// The naive dedupe: the id is committed on its own, before the work.
	tag, err := rc.pool.Exec(ctx,
		"INSERT INTO naive_processed_events (event_id) VALUES ($1) ON CONFLICT (event_id) DO NOTHING", ev.ID)
	if err != nil {
		http.Error(w, "database error", http.StatusInternalServerError)
		return
	}
	if tag.RowsAffected() == 0 {
		writeJSON(w, "already processed")
		return
	}
	rc.crashAt(txhooktest.CrashAfterInsert)

	if ev.Type == "checkout.session.completed" {
		o := ev.Data.Object
		err := pgx.BeginFunc(ctx, rc.pool, func(tx pgx.Tx) error {
			q := ordersdb.New(tx)
			if _, err := q.InsertOrder(ctx, ordersdb.InsertOrderParams{
				CheckoutSessionID: o.ID,
				CustomerID:        pgtype.Text{String: o.Customer, Valid: true},
				AmountTotal:       o.AmountTotal,
			}); err != nil {
				return err
			}
			if err := q.AddCustomerSpend(ctx, ordersdb.AddCustomerSpendParams{ID: o.Customer, Amount: o.AmountTotal}); err != nil {
				return err
			}
			rc.crashAt(txhooktest.CrashAfterHandler)
			return nil
		})
		if err != nil {
			// The id is already committed: this event will never run again.
			http.Error(w, "database error", http.StatusInternalServerError)
			return
		}
	}
	writeJSON(w, "processed")
}

func (rc *receiver) crashAt(p txhooktest.CrashPoint) {
	if rc.crash == p {
		fmt.Fprintf(os.Stderr, "naivereceiver: crash point %q reached, exiting\n", p)
		os.Exit(txhooktest.CrashExitCode)
	}
}

func writeJSON(w http.ResponseWriter, outcome string) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, "{\"status\":%q}\n", outcome)
}
