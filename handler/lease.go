package handler

import (
	"context"

	"github.com/txhook/txhook"
)

// LeaseRoute is a lease-mode route, for handlers with effects outside the
// database (HTTP calls, email, queues): Handler's external work runs under a
// claim on the event's key, and its business writes commit with the done
// mark (Processor.ProcessLease). The endpoint answers its outcomes like any
// other route's: processed, duplicate and failed (a permanent error) with
// 200; in flight (another delivery holds a live claim) with 409 or 503 and a
// Retry-After of the time left on that claim; a handler error or a lost
// claim with 5xx.
type LeaseRoute struct {
	// Handler applies the event. Its Work is required.
	Handler txhook.LeaseHandler
}

// Lease returns a lease-mode route running h.
func Lease(h txhook.LeaseHandler) *LeaseRoute { return &LeaseRoute{Handler: h} }

// Apply implements Route with Processor.ProcessLease.
func (r *LeaseRoute) Apply(ctx context.Context, p *txhook.Processor, ev txhook.Event) (txhook.Result, error) {
	return p.ProcessLease(ctx, ev, r.Handler)
}

// LeaseHandler returns the route's handler, for replaying recorded events
// with Processor.ReplayLease.
func (r *LeaseRoute) LeaseHandler() txhook.LeaseHandler { return r.Handler }

// LeaseHandler returns the lease-mode handler of the route for eventType
// (its route's, else the fallback's), for replaying recorded events; see
// txhook.ReplayerConfig.LeaseLookup.
func (e *Endpoint) LeaseHandler(eventType string) (txhook.LeaseHandler, bool) {
	r, ok := e.Route(eventType)
	if !ok {
		return txhook.LeaseHandler{}, false
	}
	lr, ok := r.(interface{ LeaseHandler() txhook.LeaseHandler })
	if !ok {
		return txhook.LeaseHandler{}, false
	}
	return lr.LeaseHandler(), true
}
