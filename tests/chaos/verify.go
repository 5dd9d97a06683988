package main

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// maxProblems bounds the problems listed in a result.
const maxProblems = 20

// verify checks the database against what was sent and adds what it finds
// to res: an event whose effect is missing (or whose acknowledgement has no
// committed key behind it) is lost; an effect applied twice is duplicated.
// shipped is the fulfillment service's record (nil without lease mode).
// checkKeys checks txhook's events table (the naive receiver keeps its own).
func verify(ctx context.Context, dbURL, tag string, events []*event, shipped map[string][]string, checkKeys bool, res *result) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("connect to check the database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))

	lost := map[string]bool{}
	dup := map[string]bool{}
	problem := func(set map[string]bool, id, format string, args ...any) {
		set[id] = true
		if len(res.Problems) < maxProblems {
			res.Problems = append(res.Problems, fmt.Sprintf(format, args...))
		}
	}

	keys := map[string]string{}
	if checkKeys {
		keys, err = queryMap(ctx, conn, `SELECT event_key, status FROM txhook_processed_events
			WHERE source = 'stripe' AND starts_with(event_key, $1)`, "evt_"+tag+"_")
		if err != nil {
			return fmt.Errorf("read event keys: %w", err)
		}
	}
	orders, err := queryMap(ctx, conn, `SELECT checkout_session_id, coalesce(customer_id, '') || ':' || amount_total
		FROM orders WHERE starts_with(checkout_session_id, $1)`, "cs_"+tag+"_")
	if err != nil {
		return fmt.Errorf("read orders: %w", err)
	}
	customers, err := queryMap(ctx, conn, `SELECT id, total_spent::text FROM customers WHERE starts_with(id, $1)`, "cus_"+tag+"_")
	if err != nil {
		return fmt.Errorf("read customers: %w", err)
	}
	invoices, err := queryMap(ctx, conn, `SELECT id, status || ':' || amount_due FROM invoices WHERE starts_with(id, $1)`, "in_"+tag+"_")
	if err != nil {
		return fmt.Errorf("read invoices: %w", err)
	}
	shipments, err := queryMap(ctx, conn, `SELECT payment_intent_id, amount || ':' || idempotency_key
		FROM shipments WHERE starts_with(payment_intent_id, $1)`, "pi_"+tag+"_")
	if err != nil {
		return fmt.Errorf("read shipments: %w", err)
	}

	wantSpent := map[string]int64{}
	paid := map[string]bool{} // invoices whose invoice.paid was acknowledged
	for _, e := range events {
		if n := e.processed.Load(); n > 1 {
			problem(dup, e.id, "%s: %d deliveries answered processed", e.id, n)
		}
		if !e.acked.Load() {
			continue // counted as unacknowledged
		}
		if st := keys[e.id]; checkKeys && st != "done" {
			problem(lost, e.id, "%s was acknowledged but its key is %q, not done", e.id, st)
		}
		switch e.kind {
		case kindCheckout:
			want := fmt.Sprintf("%s:%d", e.customer, e.amount)
			if got, ok := orders[e.object]; !ok {
				problem(lost, e.id, "%s: no order %s", e.id, e.object)
			} else if got != want {
				problem(lost, e.id, "%s: order %s is %s, want %s", e.id, e.object, got, want)
			}
			if e.customer != "" {
				wantSpent[e.customer] += e.amount
			}
		case kindInvoicePaid:
			paid[e.object] = true
			want := fmt.Sprintf("paid:%d", e.amount)
			if got := invoices[e.object]; got != want {
				problem(lost, e.id, "%s: invoice %s is %q, want %s", e.id, e.object, got, want)
			}
		case kindInvoiceCreate:
			if _, ok := invoices[e.object]; !ok {
				problem(lost, e.id, "%s: no invoice %s", e.id, e.object)
			}
		case kindPaymentIntent:
			got, ok := shipments[e.object]
			keys := shipped[e.object]
			switch {
			case !ok:
				problem(lost, e.id, "%s: no shipment for %s", e.id, e.object)
			case len(keys) == 0:
				problem(lost, e.id, "%s: shipment %s recorded but the fulfillment service never shipped it", e.id, e.object)
			case got != fmt.Sprintf("%d:%s", e.amount, keys[0]):
				problem(lost, e.id, "%s: shipment %s is %s, want amount %d and key %s", e.id, e.object, got, e.amount, keys[0])
			}
			if len(keys) > 1 {
				problem(dup, e.id, "%s: %s shipped under %d idempotency keys %v", e.id, e.object, len(keys), keys)
			}
		}
	}
	// Totals: a customer above its sum had an event applied twice; below,
	// one went missing.
	var ids []string
	for id := range customers {
		ids = append(ids, id)
	}
	for id := range wantSpent {
		if _, ok := customers[id]; !ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		got, want := customers[id], fmt.Sprint(wantSpent[id])
		var g int64
		fmt.Sscan(got, &g)
		switch {
		case g > wantSpent[id]:
			problem(dup, id, "customer %s total_spent = %s, want %s", id, got, want)
		case g < wantSpent[id]:
			problem(lost, id, "customer %s total_spent = %q, want %s", id, got, want)
		}
	}
	var inProgress int
	for _, st := range keys {
		if st == "in_progress" {
			inProgress++
		}
	}
	if inProgress > 0 {
		res.Problems = append(res.Problems, fmt.Sprintf("%d events left in_progress", inProgress))
	}
	res.Lost += len(lost)
	res.Duplicated += len(dup)
	return nil
}

// queryMap runs a two-column text query and returns it as a map.
func queryMap(ctx context.Context, conn *pgx.Conn, sql string, args ...any) (map[string]string, error) {
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	var k, v string
	_, err = pgx.ForEachRow(rows, []any{&k, &v}, func() error {
		m[k] = v
		return nil
	})
	return m, err
}
