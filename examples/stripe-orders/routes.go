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
// operator console at /txhook/ behind HTTP basic auth (user admin). The
// processor it returns holds the same routes (Config.Routes), for the
// broker consumers.
func newHandler(pool *pgxpool.Pool, cfg config, log *slog.Logger) (http.Handler, *txhook.Processor, error) {
	rs := routes(cfg)
	proc, err := newProcessor(pool, registry(rs))
	if err != nil {
		return nil, nil, err
	}
	ep, err := handler.New(proc, &handler.Config{
		Source:   source,
		Provider: &handler.Stripe{Secrets: splitSecrets(cfg.WebhookSecret)},
		Routes:   rs, // any other type is acknowledged, nothing written
		Logger:   log,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("new endpoint: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /webhooks/stripe", ep)
	if cfg.ConsolePassword != "" {
		replayer, err := newReplayer(pool, proc, rs)
		if err != nil {
			return nil, nil, err
		}
		console := admin.New(pool, &admin.Config{
			AllowWrites: true,
			Replayer:    replayer,
			User:        func(r *http.Request) string { u, _, _ := r.BasicAuth(); return u },
			Logger:      log,
		})
		mux.Handle("/txhook/", http.StripPrefix("/txhook", basicAuth(consoleUser, cfg.ConsolePassword, console)))
	}
	return mux, proc, nil
}

// newProcessor returns the example's txhook processor on pool, with reg as
// its routes (nil for none).
func newProcessor(pool *pgxpool.Pool, reg *txhook.Routes) (*txhook.Processor, error) {
	// StorePayload keeps each event's body, so that an event recorded as
	// failed can be replayed by an operator. The handlers only decode, check
	// and write through their transaction, so the dedupe step can travel
	// with their first statement (DedupeWithFirstStatement): one round trip
	// fewer per event. With the write checkout.session.completed defers to
	// COMMIT, one of those events costs two round trips.
	proc, err := txhook.NewProcessor(pool, &txhook.Config{StorePayload: true, DedupeWithFirstStatement: true, Routes: reg})
	if err != nil {
		return nil, fmt.Errorf("new processor: %w", err)
	}
	return proc, nil
}

// routes returns the example's handlers by event type.
func routes(cfg config) map[string]handler.Route {
	rs := map[string]handler.Route{
		"checkout.session.completed": handler.Tx(checkoutSessionCompleted),
		"invoice.created":            handler.Tx(txhook.WithQueries(ordersdb.New, invoiceCreated)),
		"invoice.paid":               handler.Tx(txhook.WithQueries(ordersdb.New, invoicePaid)),
	}
	if cfg.FulfillmentURL != "" {
		f := newFulfillment(cfg.FulfillmentURL)
		rs["payment_intent.succeeded"] = handler.Lease(f.leaseHandler())
	}
	return rs
}

// registry returns rs, the endpoint's routes, as txhook's registry of the
// source: the same handlers, for the broker consumers (Processor.Deliver).
func registry(rs map[string]handler.Route) *txhook.Routes {
	reg := txhook.NewRoutes()
	for typ, r := range rs {
		switch r := r.(type) {
		case *handler.TxRoute:
			reg.Transactional(source, typ, r.Handler)
		case *handler.LeaseRoute:
			reg.Lease(source, typ, r.Handler)
		}
	}
	return reg
}

// newReplayer returns a Replayer that runs failed events again through the
// same handlers as a delivery, for the console and "stripe-orders txhook
// replay".
func newReplayer(pool *pgxpool.Pool, proc *txhook.Processor, rs map[string]handler.Route) (*txhook.Replayer, error) {
	txLookup := func(typ string) (txhook.HandlerFunc, bool) {
		r, ok := rs[typ].(*handler.TxRoute)
		if !ok {
			return nil, false
		}
		return r.Handler, true
	}
	leaseLookup := func(typ string) (txhook.LeaseHandler, bool) {
		r, ok := rs[typ].(*handler.LeaseRoute)
		if !ok {
			return txhook.LeaseHandler{}, false
		}
		return r.Handler, true
	}
	r, err := txhook.NewReplayer(pool, txLookup, &txhook.ReplayerConfig{LeaseLookup: leaseLookup, Processor: proc})
	if err != nil {
		return nil, fmt.Errorf("new replayer: %w", err)
	}
	return r, nil
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
