package main

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/admin"
	"github.com/txhook/txhook/examples/stripe-orders/ordersdb"
	"github.com/txhook/txhook/handler"
)

// source is the endpoint's name in txhook's events table.
const source = "stripe"

// newHandler returns the example's HTTP handler: POST /webhooks/stripe,
// verified with the endpoint's signing secret and applied through a txhook
// processor on pool; and, when cfg.ConsolePassword is set, txhook's
// operator console at /txhook/ behind HTTP basic auth (user admin), whose
// Replay runs the same routes. It returns the processor too, for the queue's
// consumer (main.go).
func newHandler(pool *pgxpool.Pool, cfg config, log *slog.Logger) (http.Handler, *txhook.Processor, error) {
	proc, err := newProcessor(pool, cfg)
	if err != nil {
		return nil, nil, err
	}
	ep, err := handler.New(proc, &handler.Config{
		Source:   source,
		Provider: &handler.Stripe{Secrets: splitSecrets(cfg.WebhookSecret)},
		Logger:   log,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("new endpoint: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /webhooks/stripe", ep)
	if cfg.ConsolePassword != "" {
		console, err := admin.New(pool, &admin.Config{
			AllowWrites: true,
			Processor:   proc,
			User:        func(r *http.Request) string { u, _, _ := r.BasicAuth(); return u },
			Logger:      log,
		})
		if err != nil {
			return nil, nil, fmt.Errorf("new console: %w", err)
		}
		mux.Handle("/txhook/", http.StripPrefix("/txhook", basicAuth(consoleUser, cfg.ConsolePassword, console)))
	}
	return mux, proc, nil
}

// newProcessor returns the example's txhook processor on pool, with its
// routes.
func newProcessor(pool *pgxpool.Pool, cfg config) (*txhook.Processor, error) {
	// StorePayload keeps each event's body, so that an event recorded as
	// failed can be replayed by an operator. The handlers only decode, check
	// and write through their transaction, so the dedupe step can travel
	// with their first statement (DedupeWithFirstStatement): one round trip
	// fewer per event. checkout.session.completed defers both its writes,
	// so one of those events costs one round trip: BEGIN, the dedupe step,
	// the writes and COMMIT.
	proc, err := txhook.NewProcessor(pool, &txhook.Config{
		Routes:                   routes(cfg),
		StorePayload:             true,
		DedupeWithFirstStatement: true,
	})
	if err != nil {
		return nil, fmt.Errorf("new processor: %w", err)
	}
	return proc, nil
}

// routes returns the example's handlers, registered once by source and
// event type: every delivery, replay and console action finds them here.
// Any other type is acknowledged, nothing written.
func routes(cfg config) *txhook.Routes {
	rs := txhook.NewRoutes()
	rs.Transactional(source, "checkout.session.completed", checkoutSessionCompleted)
	rs.Transactional(source, "invoice.created", txhook.WithQueries(ordersdb.New, invoiceCreated))
	rs.Transactional(source, "invoice.paid", txhook.WithQueries(ordersdb.New, invoicePaid))
	if cfg.FulfillmentURL != "" {
		f := newFulfillment(cfg.FulfillmentURL)
		rs.Lease(source, "payment_intent.succeeded", f.leaseHandler())
	}
	return rs
}

// consoleUser is the console's basic auth user name.
const consoleUser = "admin"

// basicAuth lets through requests that carry user and password, compared in
// constant time, and answers the others 401.
func basicAuth(user, password string, next http.Handler) http.Handler {
	wantUser := sha256.Sum256([]byte(user))
	wantPass := sha256.Sum256([]byte(password))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		gotUser, gotPass := sha256.Sum256([]byte(u)), sha256.Sum256([]byte(p))
		userOK := subtle.ConstantTimeCompare(gotUser[:], wantUser[:]) == 1
		passOK := subtle.ConstantTimeCompare(gotPass[:], wantPass[:]) == 1
		if !ok || !userOK || !passOK {
			w.Header().Set("WWW-Authenticate", `Basic realm="txhook console", charset="UTF-8"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// splitSecrets splits a comma-separated list of signing secrets: during a
// secret roll Stripe signs with both the old and the new one.
func splitSecrets(s string) []string {
	var out []string
	for part := range strings.SplitSeq(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}
