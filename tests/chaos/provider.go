package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/txhook/txhook/handler"
)

// provider acts as Stripe: it signs every attempt with a fresh timestamp and
// retries each delivery with backoff until it gets a 2xx. A timeout, a
// dropped connection and any non-2xx answer are failures.
//
// With several receiver URLs it stands in for Stripe behind a round-robin
// load balancer: each attempt goes to the next URL in turn, and a retry
// never to the receiver that failed the attempt before it.
type provider struct {
	urls   []string
	turn   atomic.Uint64 // attempts handed out so far, for the round robin
	signer *handler.Stripe
	client *http.Client

	attempts atomic.Int64 // HTTP requests sent
	failures atomic.Int64 // attempts without a 2xx
	rejected atomic.Int64 // 4xx answers other than 409: should never happen
	acked    atomic.Int64 // events acknowledged at least once
}

func newProvider(urls []string, secret string, conns int) *provider {
	return &provider{
		urls:   urls,
		signer: &handler.Stripe{Secrets: []string{secret}},
		client: &http.Client{
			Timeout: 5 * time.Second,
			Transport: &http.Transport{
				MaxIdleConns:        conns,
				MaxIdleConnsPerHost: conns,
				IdleConnTimeout:     30 * time.Second,
			},
		},
	}
}

// Backoff between failed attempts of one delivery.
const (
	minBackoff = 20 * time.Millisecond
	maxBackoff = time.Second
)

// deliver sends one delivery of e until it is acknowledged or ctx ends, and
// reports whether it was acknowledged.
func (p *provider) deliver(ctx context.Context, e *event) bool {
	wait := minBackoff
	last := -1 // the receiver of the previous attempt
	for ctx.Err() == nil {
		last = p.next(last)
		status, outcome, retryAfter := p.attempt(ctx, p.urls[last], e)
		if status >= 200 && status < 300 {
			if outcome == "processed" {
				e.processed.Add(1)
			}
			if e.acked.CompareAndSwap(false, true) {
				p.acked.Add(1)
			}
			return true
		}
		p.failures.Add(1)
		if status >= 400 && status < 500 && status != http.StatusConflict {
			p.rejected.Add(1)
		}
		d := rand.N(wait) + 1 // full jitter
		if retryAfter > 0 {
			// A real provider waits at least Retry-After; the run caps it so
			// that it stays short.
			d = min(retryAfter, maxBackoff)
		}
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
		wait = min(2*wait, maxBackoff)
	}
	return false
}

// next returns the index of the receiver for the next attempt: the next one
// in turn, skipping last (the previous attempt's) when there are others.
func (p *provider) next(last int) int {
	n := uint64(len(p.urls))
	i := int((p.turn.Add(1) - 1) % n)
	if i == last && n > 1 {
		i = (i + 1) % int(n)
	}
	return i
}

// attempt makes one HTTP request and returns the status (0 when no answer
// came), the answer's "status" field and its Retry-After.
func (p *provider) attempt(ctx context.Context, url string, e *event) (int, string, time.Duration) {
	p.attempts.Add(1)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(e.body))
	if err != nil {
		return 0, "", 0
	}
	req.Header.Set("Content-Type", "application/json")
	if err := p.signer.Sign(req.Header, e.body, time.Now()); err != nil {
		return 0, "", 0
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return 0, "", 0
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if err != nil {
		return 0, "", 0 // the connection dropped mid-answer: not acknowledged
	}
	var answer struct {
		Status string `json:"status"`
	}
	_ = json.Unmarshal(b, &answer)
	var retryAfter time.Duration
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		retryAfter = time.Duration(s) * time.Second
	}
	return resp.StatusCode, answer.Status, retryAfter
}
