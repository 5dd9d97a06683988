package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/txhook/txhook/handler"
)

// checkoutCompleted returns the body of a checkout.session.completed event
// in Stripe's shape (only the fields the example reads, plus the envelope).
func checkoutCompleted(eventID, sessionID, customer string, amount int64) []byte {
	ev := map[string]any{
		"id":          eventID,
		"object":      "event",
		"api_version": "2024-06-20",
		"created":     time.Now().Unix(),
		"livemode":    false,
		"type":        "checkout.session.completed",
		"data": map[string]any{
			"object": map[string]any{
				"id":             sessionID,
				"object":         "checkout.session",
				"customer":       customer,
				"amount_total":   amount,
				"currency":       "usd",
				"payment_status": "paid",
			},
		},
	}
	b, err := json.Marshal(ev)
	if err != nil {
		panic(err) // a map of strings and numbers always marshals
	}
	return b
}

// answer is what a delivery got back.
type answer struct {
	// Status is the HTTP status, 0 when no response came.
	Status int
	// Body is the response body, trimmed.
	Body string
	// Err is the transport error when no response came.
	Err error
}

func (a answer) String() string {
	if a.Err != nil {
		return "no answer: " + transportError(a.Err)
	}
	return fmt.Sprintf("HTTP %d %s", a.Status, a.Body)
}

// outcome returns the "status" field of a JSON answer ("processed",
// "duplicate"), or "" when there is none.
func (a answer) outcome() string {
	var v struct {
		Status string `json:"status"`
	}
	if a.Err != nil || json.Unmarshal([]byte(a.Body), &v) != nil {
		return ""
	}
	return v.Status
}

// transportError describes a failed request without the URL.
func transportError(err error) string {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		err = ue.Err
	}
	if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
		return "the connection closed (" + err.Error() + ")"
	}
	return err.Error()
}

// sender acts as Stripe: it signs each delivery with the endpoint's secret
// and a fresh timestamp, as Stripe does on every attempt.
type sender struct {
	signer *handler.Stripe
	client *http.Client
}

func newSender(secret string) *sender {
	return &sender{
		signer: &handler.Stripe{Secrets: []string{secret}},
		client: &http.Client{Timeout: 15 * time.Second},
	}
}

// deliver POSTs body to the receiver at addr.
func (s *sender) deliver(ctx context.Context, addr string, body []byte) answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/webhooks/stripe", bytes.NewReader(body))
	if err != nil {
		return answer{Err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	if err := s.signer.Sign(req.Header, body, time.Now()); err != nil {
		return answer{Err: fmt.Errorf("sign: %w", err)}
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return answer{Err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if err != nil {
		return answer{Err: fmt.Errorf("read answer: %w", err)}
	}
	return answer{Status: resp.StatusCode, Body: strings.TrimSpace(string(b))}
}
