package txhook_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/internal/testdb"
)

// A queue consumer, without HTTP: each message's id is the event's key, so a
// message the queue delivers again is a duplicate and changes nothing. A
// message is acknowledged only once Process says its effects are committed
// (processed), were committed before (duplicate) or were recorded as a dead
// letter (failed).
func ExampleProcessor_Process() {
	ctx := context.Background()
	// In an application: pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")),
	// with txhook's migrations applied (migrations.Up).
	d, drop, err := testdb.ForExample("process")
	if err != nil {
		log.Fatal(err)
	}
	defer drop()
	pool := d.Pool
	if _, err := pool.Exec(ctx, "CREATE TABLE orders (id text PRIMARY KEY, amount bigint NOT NULL)"); err != nil {
		log.Fatal(err)
	}

	proc, err := txhook.NewProcessor(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	onOrder := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		var o struct {
			Order  string `json:"order"`
			Amount int64  `json:"amount"`
		}
		if err := json.Unmarshal(ev.Payload, &o); err != nil || o.Order == "" {
			return txhook.Permanent(fmt.Errorf("decode order: %v", err)) // can never succeed: a dead letter
		}
		_, err := tx.Exec(ctx, "INSERT INTO orders (id, amount) VALUES ($1, $2)", o.Order, o.Amount)
		return err
	}

	type message struct{ ID, Body string }
	queue := []message{
		{"msg-1", `{"order":"o-1","amount":4200}`},
		{"msg-2", `{"order":"o-2","amount":1500}`},
		{"msg-1", `{"order":"o-1","amount":4200}`}, // delivered again by the queue
		{"msg-3", `not json`},
	}
	for _, m := range queue {
		ev := txhook.Event{Source: "orders-queue", Key: m.ID, Type: "order.created", Payload: []byte(m.Body)}
		res, err := proc.Process(ctx, ev, onOrder)
		switch {
		case err != nil:
			fmt.Println(m.ID, "not acknowledged:", err) // nothing committed: the queue redelivers
			continue
		case res.Outcome == txhook.OutcomeInFlight:
			fmt.Println(m.ID, "in flight elsewhere: retry later")
			continue
		}
		fmt.Println(m.ID, res.Outcome, "-> acknowledged")
	}

	var orders, total int64
	if err := pool.QueryRow(ctx, "SELECT count(*), coalesce(sum(amount), 0) FROM orders").Scan(&orders, &total); err != nil {
		log.Fatal(err)
	}
	fmt.Println("orders:", orders, "total:", total)
	// Output:
	// msg-1 processed -> acknowledged
	// msg-2 processed -> acknowledged
	// msg-1 duplicate -> acknowledged
	// msg-3 failed -> acknowledged
	// orders: 2 total: 5700
}
