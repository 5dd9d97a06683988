package txhook_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
)

// A lease-mode handler that charges a card through an external API and then
// records the charge. The charge carries the event's idempotency key, so a
// charge repeated after a crash or a takeover is dropped by the API.
func ExampleProcessor_ProcessLease() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		panic(err)
	}
	p, err := txhook.NewProcessor(pool, nil)
	if err != nil {
		panic(err)
	}
	h := txhook.LeaseHandler{
		Lease: 20 * time.Second, // longer than the charge ever takes
		Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost,
				"https://api.example.com/v1/charges", strings.NewReader("amount=4200"))
			if err != nil {
				return nil, err
			}
			req.Header.Set("Idempotency-Key", c.IdempotencyKey("charge"))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return nil, err
			}
			resp.Body.Close()
			if resp.StatusCode >= 500 {
				return nil, fmt.Errorf("charge: status %d", resp.StatusCode) // retried
			}
			if resp.StatusCode >= 400 {
				return nil, txhook.Permanent(fmt.Errorf("charge: status %d", resp.StatusCode))
			}
			return func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "INSERT INTO charges (event_id) VALUES ($1)", ev.Key)
				return err
			}, nil
		},
	}
	res, err := p.ProcessLease(ctx, txhook.Event{Source: "stripe", Key: "evt_1"}, h)
	if err != nil {
		// Not processed: answer 5xx so that the sender retries.
		return
	}
	fmt.Println(res.Outcome, res.RetryAfter)
}
