package handler_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
)

// Mounting a Stripe endpoint and a GitHub endpoint on one mux.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	// Every handler is registered once, by source and event type.
	routes := txhook.NewRoutes()
	routes.Transactional("stripe", "invoice.paid", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		// Business writes go through tx: they commit with the key.
		_, err := tx.Exec(ctx, `INSERT INTO paid_invoices (event_id) VALUES ($1)`, ev.Key)
		return err
	})
	routes.Transactional("github", "push", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO pushes (delivery_id) VALUES ($1)`, ev.Key)
		return err
	})
	proc, err := txhook.NewProcessor(pool, &txhook.Config{Routes: routes})
	if err != nil {
		log.Fatal(err)
	}

	// An endpoint per source verifies its deliveries and applies them
	// through the source's routes.
	stripe, err := handler.New(proc, &handler.Config{
		Source:   "stripe",
		Provider: &handler.Stripe{Secrets: []string{os.Getenv("STRIPE_WEBHOOK_SECRET")}},
	})
	if err != nil {
		log.Fatal(err)
	}
	github, err := handler.New(proc, &handler.Config{
		Source:   "github",
		Provider: &handler.GitHub{Secrets: []string{os.Getenv("GITHUB_WEBHOOK_SECRET")}},
	})
	if err != nil {
		log.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.Handle("POST /webhooks/stripe", stripe)
	mux.Handle("POST /webhooks/github", github)
	log.Fatal(http.ListenAndServe(":8080", mux))
}

// A custom scheme: a hex HMAC-SHA256 of the body in X-Signature, the key in
// the body's "id" field and the type in its "event" field; two secrets while
// the old one is being retired.
func ExampleHMAC() {
	p := &handler.HMAC{
		Secrets:         []string{"new-secret", "old-secret"},
		SignatureHeader: "X-Signature",
		Prefix:          "sha256=",
		KeyField:        "id",
		TypeField:       "event",
	}
	body := []byte(`{"id":"e-42","event":"order.created"}`)

	// A sender still signing with the old secret.
	old := *p
	old.Secrets = []string{"old-secret"}
	h := http.Header{}
	if err := old.Sign(h, body, time.Now()); err != nil {
		log.Fatal(err)
	}

	fmt.Println(p.Verify(h, body, time.Now()))
	d, err := p.Extract(h, body)
	fmt.Println(d.Key, d.Type, err)
	// Output:
	// <nil>
	// e-42 order.created <nil>
}
