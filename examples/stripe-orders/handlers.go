package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/examples/stripe-orders/ordersdb"
)

// The transactional handlers. Each runs in the transaction that records the
// event's key and writes through the example's sqlc queries bound to that
// transaction (ordersdb.New(tx), or txhook.WithQueries(ordersdb.New, ...) in
// routes.go), so every write it can make commits together with the key or
// not at all.
//
// A payload that can never be applied (a missing id, a negative amount) is a
// txhook.Permanent error: the event is recorded as failed, with its payload,
// for an operator to fix and replay, and Stripe is told to stop retrying.
// Any other error rolls everything back and Stripe's retry runs the handler
// again.

// stripeEvent is the envelope of every Stripe event; data.object depends on
// the event's type.
type stripeEvent[T any] struct {
	ID   string `json:"id"`
	Type string `json:"type"`
	Data struct {
		Object T `json:"object"`
	} `json:"data"`
}

// checkoutSession is the part of a Checkout Session object the example uses.
type checkoutSession struct {
	ID string `json:"id"`
	// Customer is null for a guest checkout.
	Customer    *string `json:"customer"`
	AmountTotal *int64  `json:"amount_total"`
}

// invoice is the part of an Invoice object the example uses.
type invoice struct {
	ID        string `json:"id"`
	Customer  string `json:"customer"`
	AmountDue *int64 `json:"amount_due"`
}

// object decodes the event's data.object. A body that does not decode is a
// permanent error: retrying cannot fix it.
func object[T any](ev txhook.Event) (T, error) {
	var e stripeEvent[T]
	if err := json.Unmarshal(ev.Payload, &e); err != nil {
		return e.Data.Object, txhook.Permanent(fmt.Errorf("decode %s: %w", ev.Type, err))
	}
	return e.Data.Object, nil
}

// errBadObject reports a data.object that lacks what the handler needs.
var errBadObject = errors.New("invalid data.object")

func badObject(ev txhook.Event, what string) error {
	return txhook.Permanent(fmt.Errorf("%s: %w: %s", ev.Type, errBadObject, what))
}

// checkoutSessionCompleted records the order and adds its amount to the
// customer's total. The total's update is deliberately not idempotent: it is
// correct only because the event's key commits in the same transaction, so
// a redelivered event never reaches it. The handler needs no answer from
// either write, so both are deferred (txhook.Deferred): with the dedupe step
// sent with the handler's first statement (routes.go), they travel with
// BEGIN, the dedupe step and COMMIT, one round trip for the event.
func checkoutSessionCompleted(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
	cs, err := object[checkoutSession](ev)
	if err != nil {
		return err
	}
	switch {
	case cs.ID == "":
		return badObject(ev, "missing id")
	case cs.AmountTotal == nil || *cs.AmountTotal < 0:
		return badObject(ev, "missing or negative amount_total")
	}
	customer := pgtype.Text{}
	if cs.Customer != nil && *cs.Customer != "" {
		customer = pgtype.Text{String: *cs.Customer, Valid: true}
	}
	later := ordersdb.New(txhook.Deferred(tx))
	if _, err := later.InsertOrder(ctx, ordersdb.InsertOrderParams{
		CheckoutSessionID: cs.ID,
		CustomerID:        customer,
		AmountTotal:       *cs.AmountTotal,
	}); err != nil {
		return fmt.Errorf("insert order: %w", err)
	}
	if !customer.Valid {
		return nil // a guest checkout: no customer total to keep
	}
	if err := later.AddCustomerSpend(ctx, ordersdb.AddCustomerSpendParams{
		ID:     customer.String,
		Amount: *cs.AmountTotal,
	}); err != nil {
		return fmt.Errorf("add customer spend: %w", err)
	}
	return nil
}

// invoiceCreated records the invoice as pending. It is idempotent on its own
// (ON CONFLICT DO NOTHING) and leaves an invoice that invoice.paid already
// recorded as paid.
func invoiceCreated(ctx context.Context, q *ordersdb.Queries, ev txhook.Event) error {
	in, err := validInvoice(ev)
	if err != nil {
		return err
	}
	if _, err := q.CreateInvoice(ctx, ordersdb.CreateInvoiceParams{
		ID:         in.ID,
		CustomerID: in.Customer,
		AmountDue:  *in.AmountDue,
	}); err != nil {
		return fmt.Errorf("create invoice: %w", err)
	}
	return nil
}

// invoicePaid moves the invoice from pending to paid, or records it as paid
// when invoice.created has not arrived yet (Stripe does not promise order).
// It is idempotent on its own: an invoice already paid is left as it is.
func invoicePaid(ctx context.Context, q *ordersdb.Queries, ev txhook.Event) error {
	in, err := validInvoice(ev)
	if err != nil {
		return err
	}
	if _, err := q.MarkInvoicePaid(ctx, ordersdb.MarkInvoicePaidParams{
		ID:         in.ID,
		CustomerID: in.Customer,
		AmountDue:  *in.AmountDue,
	}); err != nil {
		return fmt.Errorf("mark invoice paid: %w", err)
	}
	return nil
}

func validInvoice(ev txhook.Event) (invoice, error) {
	in, err := object[invoice](ev)
	if err != nil {
		return in, err
	}
	switch {
	case in.ID == "":
		return in, badObject(ev, "missing id")
	case in.Customer == "":
		return in, badObject(ev, "missing customer")
	case in.AmountDue == nil || *in.AmountDue < 0:
		return in, badObject(ev, "missing or negative amount_due")
	}
	return in, nil
}
