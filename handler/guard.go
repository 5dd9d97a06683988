package handler

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
)

// SharedBodies is implemented by providers that can say whether two
// legitimate deliveries of different event types may carry byte-identical
// bodies (Shopify's topics: a product's products/create and products/update
// can). When it reports true, the replay guard tells deliveries apart by type
// and body, so that neither is taken for a replay of the other; otherwise by
// body alone, so that a captured body cannot be replayed under another type
// either. See docs/handler.md.
type SharedBodies interface {
	SharedBodies() bool
}

// GuardedRoute is a Route that runs the replay guard's check itself, inside
// the transaction that records the event (an inbox route: see package
// github.com/txhook/txhook/inbox). With the guard on, the endpoint applies
// the route WithGuard returns.
type GuardedRoute interface {
	Route
	// WithGuard returns the route with g's check.
	WithGuard(g txhook.ReplayGuard) Route
}

// guard is an endpoint's replay guard: every route of the endpoint with the
// guard's check where it runs race-free (see txhook.ReplayGuard), built once.
type guard struct {
	rg       txhook.ReplayGuard
	typed    bool             // the type is part of the guarded identity
	routes   map[string]Route // Config.Routes, guarded
	fallback Route            // Config.Fallback, guarded; nil without one
	record   Route            // records a delivery answered ping or ignored
}

func newGuard(c *Config, routes map[string]Route) (*guard, error) {
	g := &guard{
		rg:     txhook.ReplayGuard{Window: c.ReplayWindow, LockTimeout: c.ReplayLockTimeout},
		routes: make(map[string]Route, len(routes)),
	}
	if sb, ok := c.Provider.(SharedBodies); ok {
		g.typed = sb.SharedBodies()
	}
	var err error
	for t, r := range routes {
		if g.routes[t], err = g.wrap(r, c.DB); err != nil {
			return nil, err
		}
	}
	if c.Fallback != nil {
		if g.fallback, err = g.wrap(c.Fallback, c.DB); err != nil {
			return nil, err
		}
	}
	g.record = Tx(g.rg.Handler(func(context.Context, pgx.Tx, txhook.Event) error { return nil }))
	return g, nil
}

// wrap returns r with the guard's check: inside the transaction of a Tx
// route, inside the claim of a Lease route, around any other route.
func (g *guard) wrap(r Route, d txhook.Beginner) (Route, error) {
	switch r := r.(type) {
	case *TxRoute:
		return Tx(g.rg.Handler(r.Handler)), nil
	case *LeaseRoute:
		return Lease(g.rg.Lease(r.Handler)), nil
	case GuardedRoute:
		return r.WithGuard(g.rg), nil
	}
	if d == nil {
		return nil, errors.New("the replay guard needs Config.DB for routes that are neither Tx nor Lease routes (or set ReplayGuard: ReplayGuardOff)")
	}
	return heldRoute{route: r, rg: g.rg, db: d}, nil
}

// route returns the guarded route for eventType; quiet selects the route
// recording a delivery answered ping or ignored.
func (g *guard) route(eventType string, quiet bool) Route {
	if quiet {
		return g.record
	}
	if r, ok := g.routes[eventType]; ok {
		return r
	}
	return g.fallback
}

// hash is the guarded identity of a delivery: the SHA-256 of its signed
// body or, when bodies can repeat across types, of a tag, the
// length-prefixed type and the body, so that no two (type, body) pairs
// share an input.
func (g *guard) hash(eventType string, body []byte) []byte {
	if !g.typed {
		sum := sha256.Sum256(body)
		return sum[:]
	}
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	h.Write([]byte("txhook replay guard: type and body\x00"))
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(eventType)))])
	h.Write([]byte(eventType))
	h.Write(body)
	return h.Sum(nil)
}

// heldRoute runs a route that is neither a Tx nor a Lease route while the
// guard holds its lock, after the guard's check.
type heldRoute struct {
	route Route
	rg    txhook.ReplayGuard
	db    txhook.Beginner
}

// Apply implements Route.
func (h heldRoute) Apply(ctx context.Context, p *txhook.Processor, ev txhook.Event) (txhook.Result, error) {
	if !utf8.ValidString(ev.Key) || strings.IndexByte(ev.Key, 0) >= 0 {
		// Not storable as text, so never recorded: Process rejects it.
		return h.route.Apply(ctx, p, ev)
	}
	var res txhook.Result
	err := h.rg.Run(ctx, h.db, ev, func(ctx context.Context) error {
		var err error
		res, err = h.route.Apply(ctx, p, ev)
		return err
	})
	return res, err
}
