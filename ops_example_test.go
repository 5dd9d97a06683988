package txhook_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
)

// Prune from the application: a Pruner on every instance; the pruning lock
// lets one of them delete at a time.
func ExampleNewPruner() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	pruner, err := txhook.NewPruner(pool, &txhook.PrunerConfig{
		Interval: time.Hour,
		Options:  txhook.PruneOptions{OlderThan: 30 * 24 * time.Hour},
	})
	if err != nil {
		log.Fatal(err)
	}
	go pruner.Run(ctx) // stops when ctx ends
}

// Replay failed events through the application's routes, for example from
// an admin command of the application's own binary.
func ExampleProcessor_ReplayFailed() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	// The same routes as the application's deliveries.
	routes := txhook.NewRoutes()
	routes.Transactional("stripe", "invoice.paid", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		_, err := tx.Exec(ctx, "UPDATE invoices SET status = 'paid' WHERE event_id = $1 AND status = 'pending'", ev.Key)
		return err
	})
	proc, err := txhook.NewProcessor(pool, &txhook.Config{Routes: routes})
	if err != nil {
		log.Fatal(err)
	}
	reports, err := proc.ReplayFailed(ctx, txhook.EventFilter{Source: "stripe", Limit: 100})
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range reports {
		switch {
		case errors.Is(r.Err, txhook.ErrNoPayload):
			fmt.Printf("%s: no stored payload; ask the provider to resend it\n", r.Key)
		case r.Err != nil:
			fmt.Printf("%s: %v (unchanged)\n", r.Key, r.Err)
		default:
			fmt.Printf("%s: %s\n", r.Key, r.Result.Outcome)
		}
	}
}
