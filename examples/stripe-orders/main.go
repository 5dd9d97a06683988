// Command stripe-orders receives Stripe webhooks and applies each event
// exactly once to PostgreSQL with txhook.
//
// It applies txhook's migrations and its own (orders, customers, invoices,
// shipments), then serves POST /webhooks/stripe:
//
//   - checkout.session.completed: records the order and adds its amount to
//     the customer's total, in the transaction that records the event's key;
//   - invoice.created / invoice.paid: records the invoice as pending, then
//     moves it to paid (handlers that stay correct even without the dedupe);
//   - payment_intent.succeeded, when FULFILLMENT_URL is set: asks the
//     fulfillment service to ship (lease mode, with an Idempotency-Key), then
//     records the shipment;
//   - any other type: acknowledged, nothing written.
//
// Configuration, from the environment:
//
//	DATABASE_URL           PostgreSQL connection string (required)
//	STRIPE_WEBHOOK_SECRET  the endpoint's signing secret, whsec_... (required;
//	                       several, comma-separated, while rolling the secret)
//	ADDR                   listen address (default 127.0.0.1:8080)
//	FULFILLMENT_URL        fulfillment service for payment_intent.succeeded (optional)
//	CONSOLE_PASSWORD       serves txhook's operator console at /txhook/, HTTP basic
//	                       auth with user admin and this password (optional)
//	AMQP_URL               also consumes the RabbitMQ queue orders (declared if
//	                       missing): each message a Stripe event JSON body, its id
//	                       in the message-id property, its type in the type
//	                       property (optional)
//	NATS_URL               also applies the events of the JetStream stream ORDERS
//	                       (optional; see below)
//	TXHOOK_CRASH_POINT     makes the process exit at a crash point, for crash tests
//
// Run it with:
//
//	DATABASE_URL=postgres://... STRIPE_WEBHOOK_SECRET=whsec_... go run -C examples/stripe-orders .
//
// Once it is ready it logs a line with msg=listening and the address.
//
// With NATS_URL set, it also consumes the JetStream stream ORDERS (created if
// missing, subjects orders.>): each message is a Stripe event's JSON body,
// its event id in the Nats-Msg-Id header and its type the rest of the
// subject after "orders." (orders.checkout.session.completed). The events
// go through the same routes and tables as the webhooks (source stripe), so
// an event that arrives both ways is applied once; a message without
// Nats-Msg-Id goes to the stream ORDERS_DEAD (subject orders-dead), never
// applied. The durable consumer is stripe-orders (AckWait 30s, MaxDeliver
// 10), created if missing.
//
// The same binary runs txhook's operations commands with the example's own
// handlers, so that failed events can be replayed from the command line
// (DATABASE_URL, and FULFILLMENT_URL for lease-mode events):
//
//	stripe-orders txhook dead-letters
//	stripe-orders txhook replay stripe evt_123
//	stripe-orders txhook replay --all --dry-run
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
	"github.com/txhook/txhook/cli"
	examplemigrations "github.com/txhook/txhook/examples/stripe-orders/migrations"
	"github.com/txhook/txhook/migrations"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "txhook" {
		cli.Main(os.Args[2:], txhookCommands(os.Getenv))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(ctx, os.Getenv, log); err != nil {
		fmt.Fprintln(os.Stderr, "stripe-orders:", err)
		os.Exit(1)
	}
}

// txhookCommands configures txhook's commands for "stripe-orders txhook":
// replay runs the example's own handlers.
func txhookCommands(getenv func(string) string) *cli.Config {
	return &cli.Config{
		Name: "stripe-orders txhook",
		NewProcessor: func(ctx context.Context, pool *pgxpool.Pool) (*txhook.Processor, error) {
			return newProcessor(pool, config{FulfillmentURL: strings.TrimSpace(getenv("FULFILLMENT_URL"))})
		},
	}
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
	h, proc, err := newHandler(pool, cfg, log)
	if err != nil {
		return err
	}
	// The queue's consumer starts before the server listens: a broker
	// that cannot be reached fails the start.
	if cfg.AMQPURL != "" {
		c, err := startConsumer(ctx, proc, cfg.AMQPURL, log)
		if err != nil {
			return err
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := c.Stop(sctx); err != nil {
				log.Error("stop the queue's consumer", "error", err)
			}
		}()
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Addr, err)
	}
	// Bound every phase of a connection: an unsigned request costs memory
	// and a connection until it is answered. WriteTimeout runs from the end
	// of the headers to the end of the answer, so it must exceed the
	// slowest delivery: the fulfillment route's lease.
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      fulfillmentLease + 15*time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	if cfg.NATSURL != "" {
		stopNATS, err := startNATS(ctx, cfg.NATSURL, proc, log)
		if err != nil {
			ln.Close()
			return err
		}
		defer stopNATS() // after the HTTP server's shutdown: the messages in flight are applied and acknowledged
	}
	log.Info("listening", "addr", ln.Addr().String(), "endpoint", "POST /webhooks/stripe")
	if cfg.ConsolePassword != "" {
		log.Info("operator console", "path", "/txhook/", "user", consoleUser)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down")
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

// openDatabase connects to the database and brings its schema up to date:
// txhook's migrations first, then the example's own. Both are safe when
// several instances start at once.
func openDatabase(ctx context.Context, url string) (*pgxpool.Pool, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to the database (DATABASE_URL): %w", err)
	}
	if err := migrations.Up(ctx, url); err != nil {
		pool.Close()
		return nil, fmt.Errorf("apply txhook migrations: %w", err)
	}
	if err := examplemigrations.Up(ctx, url); err != nil {
		pool.Close()
		return nil, fmt.Errorf("apply stripe-orders migrations: %w", err)
	}
	return pool, nil
}
