package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/examples/stripe-orders/ordersdb"
)

// eventBody returns a checkout.session.completed event in Stripe's shape,
// the same fields the stripe-orders example reads.
func eventBody(dst []byte, id, session, customer string, amount int64) []byte {
	return fmt.Appendf(dst, `{"id":%q,"object":"event","api_version":"2024-06-20","created":%d,"livemode":false,"type":"checkout.session.completed","data":{"object":{"id":%q,"object":"checkout.session","customer":%q,"amount_total":%d,"currency":"usd","payment_status":"paid"}}}`,
		id, time.Now().Unix(), session, customer, amount)
}

// eventSource numbers the events of one scenario so that every key is new.
type eventSource struct {
	prefix    string
	customers int
}

// next returns worker w's i-th event: its key and body.
func (s eventSource) next(w, i int) (string, []byte) {
	n := strconv.Itoa(w) + "_" + strconv.Itoa(i)
	id := "evt_" + s.prefix + "_" + n
	cus := "cus_bench_" + strconv.Itoa((w*7919+i)%s.customers)
	return id, eventBody(nil, id, "cs_"+s.prefix+"_"+n, cus, int64(100+i%9900))
}

// checkout is the part of the event the handlers read.
type checkout struct {
	ID   string `json:"id"`
	Type string `json:"type"`
	Data struct {
		Object struct {
			ID          string  `json:"id"`
			Customer    *string `json:"customer"`
			AmountTotal *int64  `json:"amount_total"`
		} `json:"object"`
	} `json:"data"`
}

var errBadEvent = errors.New("bad event")

func decodeCheckout(body []byte) (checkout, error) {
	var c checkout
	if err := json.Unmarshal(body, &c); err != nil {
		return c, fmt.Errorf("decode event: %w", err)
	}
	if c.ID == "" || c.Data.Object.ID == "" || c.Data.Object.AmountTotal == nil {
		return c, errBadEvent
	}
	return c, nil
}

// applyCheckout makes the business writes of the example's
// checkout.session.completed handler: the order through q, then the
// customer's total through later (the example defers both: with its
// configuration they travel with BEGIN, the dedupe step and COMMIT; the rows
// without txhook pass the transaction's queries for both).
func applyCheckout(ctx context.Context, q, later *ordersdb.Queries, c checkout) error {
	o := c.Data.Object
	customer := pgtype.Text{}
	if o.Customer != nil && *o.Customer != "" {
		customer = pgtype.Text{String: *o.Customer, Valid: true}
	}
	if _, err := q.InsertOrder(ctx, ordersdb.InsertOrderParams{
		CheckoutSessionID: o.ID, CustomerID: customer, AmountTotal: *o.AmountTotal,
	}); err != nil {
		return fmt.Errorf("insert order: %w", err)
	}
	if !customer.Valid {
		return nil
	}
	if err := later.AddCustomerSpend(ctx, ordersdb.AddCustomerSpendParams{ID: customer.String, Amount: *o.AmountTotal}); err != nil {
		return fmt.Errorf("add customer spend: %w", err)
	}
	return nil
}

// libraryHandler is the example's handler as a txhook.HandlerFunc.
func libraryHandler(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
	c, err := decodeCheckout(ev.Payload)
	if err != nil {
		return err
	}
	later := ordersdb.New(txhook.Deferred(tx))
	return applyCheckout(ctx, later, later, c)
}

// processLibrary applies one event with Process, as the example's endpoint
// does, and checks the outcome.
func processLibrary(ctx context.Context, p *txhook.Processor, key string, body []byte, want txhook.Outcome) error {
	res, err := p.Process(ctx, txhook.Event{Source: "stripe", Key: key, Type: "checkout.session.completed", Payload: body}, libraryHandler)
	if err != nil {
		return err
	}
	if res.Outcome != want {
		return fmt.Errorf("outcome %v, want %v", res.Outcome, want)
	}
	return nil
}

// processNaive is the naive dedupe: the key committed alone, then the work
// in a second transaction. A crash between the two loses the event.
func processNaive(ctx context.Context, pool *pgxpool.Pool, key string, body []byte) error {
	tag, err := pool.Exec(ctx, "INSERT INTO naive_processed_events (event_key) VALUES ($1) ON CONFLICT DO NOTHING", key)
	if err != nil {
		return fmt.Errorf("insert key: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return errors.New("duplicate")
	}
	c, err := decodeCheckout(body)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		q := ordersdb.New(tx)
		return applyCheckout(ctx, q, q, c)
	})
}

// insertEventSQL is the dedupe step as txhook sends it (queries/events.sql's
// InsertEvent), which bounds its own lock wait ($6), restores the session's
// lock_timeout for a new key and fails for a recorded key.
const insertEventSQL = "WITH inserted AS (INSERT INTO txhook_processed_events AS e (source, event_key, event_type, status, completed_at, payload, payload_hash) SELECT $1::text, $2::text, $3::text, 'done', now(), $4::bytea, $5::bytea FROM (SELECT set_config('txhook.lock_timeout', current_setting('lock_timeout'), true) AS saved, set_config('lock_timeout', $6::text, true) AS bound) AS b ON CONFLICT (source, event_key) DO NOTHING RETURNING set_config('lock_timeout', current_setting('txhook.lock_timeout'), true)) SELECT txhook_raise_key_recorded($1::text, $2::text) WHERE NOT EXISTS (SELECT FROM inserted)"

// processRawPgx sends the same statements as the library, written directly
// with pgx and no txhook: what the client side of the limit costs in Go.
func processRawPgx(ctx context.Context, pool *pgxpool.Pool, key string, body []byte) error {
	c, err := decodeCheckout(body)
	if err != nil {
		return err
	}
	return applyWithPgx(ctx, pool, c, insertEventSQL, "stripe", key, "checkout.session.completed", body, nil, "2000ms")
}

// applyWithPgx applies c in one transaction on db, each statement a round
// trip of its own: the dedupe step's insert (insert with args: txhook's,
// which fails for a recorded key, or a plain insert, for which inserting no
// row is an error here), then the example's writes.
func applyWithPgx(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, c checkout, insert string, args ...any) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, insert, args...)
		if err != nil {
			return fmt.Errorf("insert event: %w", err)
		}
		if tag.Insert() && tag.RowsAffected() != 1 {
			return errors.New("duplicate")
		}
		q := ordersdb.New(tx)
		return applyCheckout(ctx, q, q, c)
	})
}

// processBatchPgx sends the same statements in one round trip (a pgx batch
// wrapped in BEGIN and COMMIT), as txhook sends them for the example, with
// pgx alone: the dedupe step's failure for a recorded key makes the server
// skip the writes and COMMIT.
func processBatchPgx(ctx context.Context, pool *pgxpool.Pool, key string, body []byte) error {
	c, err := decodeCheckout(body)
	if err != nil {
		return err
	}
	o := c.Data.Object
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(insertEventSQL, "stripe", key, "checkout.session.completed", body, nil, "2000ms")
	b.Queue("INSERT INTO orders (checkout_session_id, customer_id, amount_total) VALUES ($1, $2, $3) ON CONFLICT (checkout_session_id) DO NOTHING",
		o.ID, o.Customer, *o.AmountTotal)
	b.Queue(`INSERT INTO customers AS c (id, total_spent) VALUES ($1, $2::bigint)
		ON CONFLICT (id) DO UPDATE SET total_spent = c.total_spent + EXCLUDED.total_spent, updated_at = now()`,
		*o.Customer, *o.AmountTotal)
	b.Queue("COMMIT")
	return pool.SendBatch(ctx, b).Close()
}
