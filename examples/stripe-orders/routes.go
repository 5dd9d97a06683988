package main

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/examples/stripe-orders/ordersdb"
	"github.com/txhook/txhook/handler"
)

// source is the endpoint's name in txhook's events table.
const source = "stripe"

// newHandler returns the example's HTTP handler: POST /webhooks/stripe,
// verified with the endpoint's signing secret and applied through a txhook
// processor on pool.
func newHandler(pool *pgxpool.Pool, cfg config, log *slog.Logger) (http.Handler, error) {
	// StorePayload keeps each event's body, so that an event recorded as
	// failed can be replayed by an operator. The handlers only decode, check
	// and write through their transaction, so the dedupe step can travel
	// with their first statement (DedupeWithFirstStatement): one round trip
	// fewer per event. With the write checkout.session.completed defers to
	// COMMIT, one of those events costs two round trips.
	proc, err := txhook.NewProcessor(pool, &txhook.Config{StorePayload: true, DedupeWithFirstStatement: true})
	if err != nil {
		return nil, fmt.Errorf("new processor: %w", err)
	}
	routes := map[string]handler.Route{
		"checkout.session.completed": handler.Tx(checkoutSessionCompleted),
		"invoice.created":            handler.Tx(txhook.WithQueries(ordersdb.New, invoiceCreated)),
		"invoice.paid":               handler.Tx(txhook.WithQueries(ordersdb.New, invoicePaid)),
	}
	if cfg.FulfillmentURL != "" {
		f := newFulfillment(cfg.FulfillmentURL)
		routes["payment_intent.succeeded"] = handler.Lease(f.leaseHandler())
	}
	ep, err := handler.New(proc, &handler.Config{
		Source:   source,
		Provider: &handler.Stripe{Secrets: splitSecrets(cfg.WebhookSecret)},
		Routes:   routes, // any other type is acknowledged, nothing written
		Logger:   log,
	})
	if err != nil {
		return nil, fmt.Errorf("new endpoint: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /webhooks/stripe", ep)
	return mux, nil
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
