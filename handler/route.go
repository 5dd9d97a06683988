package handler

import (
	"context"

	"github.com/txhook/txhook"
)

// Route applies a verified event of one type. The endpoint maps the result
// and error to an HTTP status exactly as it does for Processor.Process, so a
// route built on another processing mode (lease mode, for handlers with
// effects outside the database) plugs in without changing the endpoint.
type Route interface {
	Apply(ctx context.Context, p *txhook.Processor, ev txhook.Event) (txhook.Result, error)
}

// RouteFunc adapts a function to Route.
type RouteFunc func(ctx context.Context, p *txhook.Processor, ev txhook.Event) (txhook.Result, error)

// Apply calls f.
func (f RouteFunc) Apply(ctx context.Context, p *txhook.Processor, ev txhook.Event) (txhook.Result, error) {
	return f(ctx, p, ev)
}

// TxRoute is a transactional-mode route: Handler runs in the transaction
// that records the event's key (Processor.Process).
type TxRoute struct {
	// Handler applies the event. Required.
	Handler txhook.HandlerFunc
}

// Tx returns a transactional-mode route running fn.
func Tx(fn txhook.HandlerFunc) *TxRoute { return &TxRoute{Handler: fn} }

// Apply implements Route with Processor.Process.
func (r *TxRoute) Apply(ctx context.Context, p *txhook.Processor, ev txhook.Event) (txhook.Result, error) {
	return p.Process(ctx, ev, r.Handler)
}

// TxHandler returns the route's handler, for replaying events (see
// Endpoint.TxHandler).
func (r *TxRoute) TxHandler() txhook.HandlerFunc { return r.Handler }
