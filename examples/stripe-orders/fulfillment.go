package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/examples/stripe-orders/ordersdb"
)

// fulfillment asks an external fulfillment service to ship a paid
// PaymentIntent. The call is outside the database, so it runs in lease mode:
// the event is claimed, the service is called with an Idempotency-Key
// derived from the event, and the shipment row commits together with
// marking the event done. If the process dies after the call and before
// that commit, the next delivery calls the service again with the same key,
// and the service drops the repeat.
type fulfillment struct {
	url    string
	client *http.Client
}

// fulfillmentStep names the external call in the idempotency key.
const fulfillmentStep = "fulfill"

// fulfillmentLease is how long a claim holds a payment_intent.succeeded
// event: longer than the call's timeout, short enough that an event whose
// worker died is retried soon.
const fulfillmentLease = 30 * time.Second

func newFulfillment(url string) *fulfillment {
	return &fulfillment{url: url, client: &http.Client{Timeout: 10 * time.Second}}
}

func (f *fulfillment) leaseHandler() txhook.LeaseHandler {
	return txhook.LeaseHandler{Work: f.paymentIntentSucceeded, Lease: fulfillmentLease}
}

// paymentIntent is the part of a PaymentIntent object the example uses.
type paymentIntent struct {
	ID     string `json:"id"`
	Amount *int64 `json:"amount"`
}

// fulfillmentRequest is the body sent to the fulfillment service.
type fulfillmentRequest struct {
	PaymentIntent string `json:"payment_intent"`
	Amount        int64  `json:"amount"`
}

// paymentIntentSucceeded is phase one: the call to the fulfillment service.
// It returns phase two, the shipment row.
func (f *fulfillment) paymentIntentSucceeded(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
	pi, err := object[paymentIntent](ev)
	if err != nil {
		return nil, err
	}
	switch {
	case pi.ID == "":
		return nil, badObject(ev, "missing id")
	case pi.Amount == nil || *pi.Amount < 0:
		return nil, badObject(ev, "missing or negative amount")
	}
	key := c.IdempotencyKey(fulfillmentStep)
	if err := f.ship(ctx, key, fulfillmentRequest{PaymentIntent: pi.ID, Amount: *pi.Amount}); err != nil {
		return nil, err
	}
	return func(ctx context.Context, tx pgx.Tx) error {
		if _, err := ordersdb.New(tx).InsertShipment(ctx, ordersdb.InsertShipmentParams{
			PaymentIntentID: pi.ID,
			Amount:          *pi.Amount,
			IdempotencyKey:  key,
		}); err != nil {
			return fmt.Errorf("insert shipment: %w", err)
		}
		return nil
	}, nil
}

// ship POSTs the request to the fulfillment service. A 2xx is success; a
// 4xx other than 408, 409 and 429 means the service will never accept this
// request, a permanent error; anything else is worth retrying.
func (f *fulfillment) ship(ctx context.Context, idempotencyKey string, r fulfillmentRequest) error {
	body, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode fulfillment request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("new fulfillment request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", idempotencyKey)
	resp, err := f.client.Do(req)
	if err != nil {
		return fmt.Errorf("call fulfillment service: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
	switch s := resp.StatusCode; {
	case s >= 200 && s < 300:
		return nil
	case s >= 400 && s < 500 && s != http.StatusRequestTimeout && s != http.StatusConflict && s != http.StatusTooManyRequests:
		return txhook.Permanent(fmt.Errorf("fulfillment service rejected %s: %s", r.PaymentIntent, resp.Status))
	default:
		return fmt.Errorf("call fulfillment service: %s", resp.Status)
	}
}
