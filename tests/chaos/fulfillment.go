package main

import (
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
)

// fulfillmentService stands in for the external API that lease-mode events
// call. Like a real idempotent API it performs the effect (a shipment) once
// per Idempotency-Key and drops repeats; it records every call so that the
// run can check that no payment intent was shipped under two keys. It fails
// a small share of calls with 503, as a real dependency does.
type fulfillmentService struct {
	mu       sync.Mutex
	rng      *rand.Rand
	failRate float64
	calls    int
	repeats  int                 // calls with a key already shipped
	byKey    map[string]string   // idempotency key -> payment intent shipped
	shipped  map[string][]string // payment intent -> keys it was shipped under
}

func newFulfillmentService(seed uint64, failRate float64) *fulfillmentService {
	return &fulfillmentService{
		rng:      rand.New(rand.NewPCG(seed, 0x6675)),
		failRate: failRate,
		byKey:    map[string]string{},
		shipped:  map[string][]string{},
	}
}

func (s *fulfillmentService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		PaymentIntent string `json:"payment_intent"`
		Amount        int64  `json:"amount"`
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	key := r.Header.Get("Idempotency-Key")
	if err != nil || json.Unmarshal(body, &req) != nil || req.PaymentIntent == "" || key == "" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if s.rng.Float64() < s.failRate {
		http.Error(w, "try later", http.StatusServiceUnavailable)
		return
	}
	if _, ok := s.byKey[key]; ok {
		s.repeats++
		w.WriteHeader(http.StatusOK)
		return
	}
	s.byKey[key] = req.PaymentIntent
	s.shipped[req.PaymentIntent] = append(s.shipped[req.PaymentIntent], key)
	w.WriteHeader(http.StatusCreated)
}

// snapshot returns the calls so far, the repeats, and the keys each payment
// intent was shipped under.
func (s *fulfillmentService) snapshot() (calls, repeats int, shipped map[string][]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	shipped = make(map[string][]string, len(s.shipped))
	for pi, keys := range s.shipped {
		shipped[pi] = append([]string(nil), keys...)
	}
	return s.calls, s.repeats, shipped
}
