package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Kinds of events the run sends, one per route of the example.
const (
	kindCheckout      = "checkout.session.completed"
	kindInvoiceCreate = "invoice.created"
	kindInvoicePaid   = "invoice.paid"
	kindPaymentIntent = "payment_intent.succeeded"
)

// event is one Stripe event of the run and what became of its deliveries.
type event struct {
	id     string
	kind   string
	object string // the data.object's id (checkout session, invoice, payment intent)
	// customer is the checkout's customer, "" for a guest checkout.
	customer string
	amount   int64
	body     []byte

	acked     atomic.Bool  // some delivery got a 2xx
	processed atomic.Int32 // deliveries answered {"status":"processed"}
}

// job is one planned delivery of an event: copies > 1 sends that many
// deliveries of it at the same moment.
type job struct {
	ev     *event
	copies int
}

// plan is what the run sends.
type plan struct {
	events []*event
	jobs   []job
	// duplicates counts the deliveries planned beyond the first of each event.
	duplicates int
}

// makePlan builds cfg.Events events with ids tagged by tag, and the order in
// which they are delivered: every event once, some again later (a provider's
// redelivery), and some several times at once (concurrent duplicates).
func makePlan(cfg config, tag string, rng *rand.Rand) plan {
	var p plan
	add := func(e *event) {
		e.body = stripeBody(e)
		p.events = append(p.events, e)
	}
	for i := 0; len(p.events) < cfg.Events; i++ {
		r := rng.Float64()
		switch {
		case cfg.Fulfillment && r < cfg.LeaseRate:
			add(&event{
				id: fmt.Sprintf("evt_%s_%d", tag, i), kind: kindPaymentIntent,
				object: fmt.Sprintf("pi_%s_%d", tag, i), amount: 100 + rng.Int64N(9900),
			})
		case r < cfg.LeaseRate+cfg.InvoiceRate && len(p.events)+2 <= cfg.Events:
			inv := fmt.Sprintf("in_%s_%d", tag, i)
			cus := fmt.Sprintf("cus_%s_%d", tag, rng.IntN(cfg.Customers))
			amount := 100 + rng.Int64N(9900)
			add(&event{id: fmt.Sprintf("evt_%s_%dc", tag, i), kind: kindInvoiceCreate, object: inv, customer: cus, amount: amount})
			add(&event{id: fmt.Sprintf("evt_%s_%dp", tag, i), kind: kindInvoicePaid, object: inv, customer: cus, amount: amount})
		default:
			e := &event{
				id: fmt.Sprintf("evt_%s_%d", tag, i), kind: kindCheckout,
				object: fmt.Sprintf("cs_%s_%d", tag, i), amount: 100 + rng.Int64N(9900),
			}
			if rng.Float64() >= cfg.GuestRate {
				e.customer = fmt.Sprintf("cus_%s_%d", tag, rng.IntN(cfg.Customers))
			}
			add(e)
		}
	}
	// Stripe does not promise order: shuffle, then place redeliveries a
	// little later in the stream than the first delivery.
	rng.Shuffle(len(p.events), func(i, j int) { p.events[i], p.events[j] = p.events[j], p.events[i] })
	later := map[int][]job{}
	for i, e := range p.events {
		j := job{ev: e, copies: 1}
		if rng.Float64() < cfg.ConcurrentDupRate {
			j.copies = 2 + rng.IntN(2)
			p.duplicates += j.copies - 1
		}
		p.jobs = append(p.jobs, j)
		if rng.Float64() < cfg.DupRate {
			at := i + 1 + rng.IntN(max(1, cfg.Events/10))
			later[at] = append(later[at], job{ev: e, copies: 1})
			p.duplicates++
		}
		p.jobs = append(p.jobs, later[i]...)
		delete(later, i)
	}
	for i := len(p.events); len(later) > 0; i++ {
		p.jobs = append(p.jobs, later[i]...)
		delete(later, i)
	}
	return p
}

// send delivers the plan's jobs from workers goroutines, each job's copies
// at once, until they are all delivered or ctx ends; the function it
// returns waits for that.
func (p plan) send(ctx context.Context, workers int, deliver func(context.Context, *event)) (wait func()) {
	var wg sync.WaitGroup
	jobs := make(chan job)
	for range workers {
		wg.Go(func() {
			for j := range jobs {
				var cw sync.WaitGroup
				for range j.copies {
					cw.Go(func() { deliver(ctx, j.ev) })
				}
				cw.Wait()
			}
		})
	}
	go func() {
		defer close(jobs)
		for _, j := range p.jobs {
			select {
			case jobs <- j:
			case <-ctx.Done():
				return
			}
		}
	}()
	return wg.Wait
}

// stripeBody returns the event's body in Stripe's shape: the envelope and
// the fields of data.object the example reads.
func stripeBody(e *event) []byte {
	var obj map[string]any
	switch e.kind {
	case kindCheckout:
		var customer any
		if e.customer != "" {
			customer = e.customer
		}
		obj = map[string]any{
			"id": e.object, "object": "checkout.session", "customer": customer,
			"amount_total": e.amount, "currency": "usd", "payment_status": "paid",
		}
	case kindInvoiceCreate, kindInvoicePaid:
		obj = map[string]any{
			"id": e.object, "object": "invoice", "customer": e.customer,
			"amount_due": e.amount, "currency": "usd",
		}
	case kindPaymentIntent:
		obj = map[string]any{
			"id": e.object, "object": "payment_intent", "amount": e.amount,
			"currency": "usd", "status": "succeeded",
		}
	}
	b, err := json.Marshal(map[string]any{
		"id": e.id, "object": "event", "api_version": "2024-06-20",
		"created": time.Now().Unix(), "livemode": false, "type": e.kind,
		"data": map[string]any{"object": obj},
	})
	if err != nil {
		panic(err) // maps of strings and numbers always marshal
	}
	return b
}
