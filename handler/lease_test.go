package handler_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
)

// chargeAPI is a real HTTP server standing in for a downstream API; it counts
// requests per Idempotency-Key.
type chargeAPI struct {
	srv   *httptest.Server
	mu    sync.Mutex
	calls map[string]int
}

func newChargeAPI(t *testing.T) *chargeAPI {
	t.Helper()
	a := &chargeAPI{calls: map[string]int{}}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.calls[r.Header.Get("Idempotency-Key")]++
		a.mu.Unlock()
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *chargeAPI) charge(ctx context.Context, key string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.srv.URL, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := a.srv.Client().Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

func (a *chargeAPI) wantCalls(t *testing.T, key string, n int) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.calls) != 1 || a.calls[key] != n {
		t.Errorf("external calls = %v, want %d with key %s", a.calls, n, key)
	}
}

// leaseEnv is a Stripe endpoint whose invoice.paid route is lease mode with
// work; each delivery's work first calls the charge API.
func leaseEnv(t *testing.T, cfg handler.Config, h txhook.LeaseHandler) (*env, *handler.Stripe, *chargeAPI) {
	t.Helper()
	api := newChargeAPI(t)
	work := h.Work
	h.Work = func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
		if err := api.charge(ctx, c.IdempotencyKey("charge")); err != nil {
			return nil, err
		}
		return work(ctx, c, ev)
	}
	rs := txhook.NewRoutes()
	rs.Lease("stripe", "invoice.paid", h)
	e, p := stripeEnv(t, cfg, &txhook.Config{Routes: rs})
	return e, p, api
}

func recordLater(ev txhook.Event) txhook.TxFunc {
	return func(ctx context.Context, tx pgx.Tx) error { return record(ctx, tx, ev) }
}

// postAsync delivers body from another goroutine; the status arrives on the
// returned channel (0 when the request failed).
func postAsync(e *env, p *handler.Stripe, body string) <-chan int {
	ch := make(chan int, 1)
	h := http.Header{}
	if err := p.Sign(h, []byte(body), now); err != nil {
		e.t.Fatal(err)
	}
	go func() {
		ctx, cancel := context.WithTimeout(e.t.Context(), waitBound)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL, strings.NewReader(body))
		if err != nil {
			ch <- 0
			return
		}
		req.Header = h
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			ch <- 0
			return
		}
		resp.Body.Close()
		ch <- resp.StatusCode
	}()
	return ch
}

func waitStatus(t *testing.T, ch <-chan int) int {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-time.After(waitBound):
		t.Fatal("delivery did not answer")
	}
	return 0
}

// TestLeaseRouteInFlight: while one delivery holds the claim, another is
// answered 409 (or 503) with a Retry-After of the time left on the lease;
// once the first commits, deliveries are answered 200 as duplicates.
func TestLeaseRouteInFlight(t *testing.T) {
	t.Parallel()
	for _, status := range []int{0, http.StatusServiceUnavailable} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			t.Parallel()
			const lease = 10 * time.Second
			started := make(chan struct{})
			var release *released // set once the server runs
			var runs atomic.Int32
			e, p, api := leaseEnv(t, handler.Config{InFlightStatus: status}, txhook.LeaseHandler{
				Lease: lease,
				Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
					if runs.Add(1) == 1 {
						close(started)
						<-release.ch
					}
					return recordLater(ev), nil
				},
			})
			release = newReleased(t)
			body := stripeEvent("evt_lease_busy", "invoice.paid")
			start := time.Now()
			first := postAsync(e, p, body)
			select {
			case <-started:
			case s := <-first:
				t.Fatalf("first delivery answered %d before its work started", s)
			case <-time.After(waitBound):
				t.Fatal("first delivery's work did not start")
			}

			r := e.post(p, body)
			elapsed := time.Since(start)
			want := status
			if want == 0 {
				want = http.StatusConflict
			}
			r.want(t, want, "error", "in_flight")
			secs, err := strconv.Atoi(r.header.Get("Retry-After"))
			if err != nil || time.Duration(secs)*time.Second > lease || time.Duration(secs)*time.Second < lease-elapsed {
				t.Errorf("Retry-After = %q, want whole seconds in [%v, %v]", r.header.Get("Retry-After"), lease-elapsed, lease)
			}

			release.free()
			if s := waitStatus(t, first); s != http.StatusOK {
				t.Fatalf("first delivery answered %d, want 200", s)
			}
			e.post(p, body).want(t, http.StatusOK, "status", "duplicate")
			e.wantCounts(1, 1)
			if n := runs.Load(); n != 1 {
				t.Errorf("work ran %d times, want 1", n)
			}
			api.wantCalls(t, txhook.IdempotencyKey("stripe", "evt_lease_busy", "charge"), 1)
		})
	}
}

// TestLeaseRouteHandlerError: a handler error is answered 500 and releases
// the claim, so the immediate redelivery processes the event (with the same
// idempotency key downstream).
func TestLeaseRouteHandlerError(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	e, p, api := leaseEnv(t, handler.Config{}, txhook.LeaseHandler{
		Lease: time.Hour,
		Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
			if runs.Add(1) == 1 {
				return nil, errors.New("downstream answered 502")
			}
			return recordLater(ev), nil
		},
	})
	body := stripeEvent("evt_lease_err", "invoice.paid")
	e.post(p, body).want(t, http.StatusInternalServerError, "error", "error")
	e.wantCounts(1, 0)
	e.post(p, body).want(t, http.StatusOK, "status", "processed")
	e.wantCounts(1, 1)
	api.wantCalls(t, txhook.IdempotencyKey("stripe", "evt_lease_err", "charge"), 2)
}

// TestLeaseRoutePermanent: a permanent error is answered 200 (the sender
// stops retrying), recorded as failed with nothing written, and later
// deliveries are duplicates.
func TestLeaseRoutePermanent(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	e, p, _ := leaseEnv(t, handler.Config{}, txhook.LeaseHandler{
		Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
			runs.Add(1)
			return nil, txhook.Permanent(errors.New("unknown customer"))
		},
	})
	body := stripeEvent("evt_lease_perm", "invoice.paid")
	e.post(p, body).want(t, http.StatusOK, "status", "failed")
	e.post(p, body).want(t, http.StatusOK, "status", "duplicate")
	e.wantCounts(1, 0)
	row, err := txhook.GetEventRecord(t.Context(), e.pool, "stripe", "evt_lease_perm")
	if err != nil {
		t.Fatal(err)
	}
	if row.Status != "failed" || !strings.Contains(row.LastError, "unknown customer") {
		t.Errorf("row: status %s, last error %q; want failed with the error", row.Status, row.LastError)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("work ran %d times, want 1", n)
	}
}

// TestLeaseRouteLostClaim: a delivery whose lease ran out and whose event was
// taken over is answered 5xx, never 2xx, and its writes do not commit.
func TestLeaseRouteLostClaim(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	var release *released // set once the server runs
	var runs atomic.Int32
	e, p, api := leaseEnv(t, handler.Config{}, txhook.LeaseHandler{
		Lease:      200 * time.Millisecond,
		RenewEvery: -1,
		Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
			if runs.Add(1) == 1 {
				close(started)
				<-release.ch // stalls past its lease without noticing
			}
			return recordLater(ev), nil
		},
	})
	release = newReleased(t)
	body := stripeEvent("evt_lease_lost", "invoice.paid")
	first := postAsync(e, p, body)
	waitClosed(t, started, "the first delivery's work to start")
	deadline := time.Now().Add(waitBound)
	for {
		r := e.post(p, body)
		if r.status == http.StatusOK {
			r.want(t, http.StatusOK, "status", "processed")
			break
		}
		r.want(t, http.StatusConflict, "error", "in_flight")
		if time.Now().After(deadline) {
			t.Fatal("no takeover after the lease ended")
		}
		time.Sleep(20 * time.Millisecond)
	}
	release.free()
	if s := waitStatus(t, first); s < 500 {
		t.Errorf("stale delivery answered %d, want 5xx", s)
	}
	e.wantCounts(1, 1)
	api.wantCalls(t, txhook.IdempotencyKey("stripe", "evt_lease_lost", "charge"), 2)
}
