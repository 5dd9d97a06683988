package txhook

import (
	"fmt"
	"slices"
	"sync"
)

// Routes is the registry of an application's handlers: one route per source
// and event type, each with its mode. Every path that applies an event finds
// its handler here: the HTTP endpoint (package handler), the inbox's job
// (package inbox), the queue consumers, and Replay with the console
// and the CLI. A Processor is given its Routes in Config.Routes, and
// everything built on the Processor applies events through them.
//
// A route registered with the event type "" is its source's fallback: it
// applies every type of the source without a route of its own.
//
// Register routes before the Processor applies events; Routes is safe for
// concurrent use. The registering methods panic when a route is registered
// twice for one source and type, or with an invalid source or type or a nil
// handler, as http.ServeMux.Handle does: such a registry is a programming
// error that no event can fix.
type Routes struct {
	mu     sync.RWMutex
	routes map[routeKey]route
}

type routeKey struct{ source, eventType string }

// route is one registered handler and how it applies events.
type route struct {
	handler HandlerFunc  // transactional mode; nil in lease mode
	lease   LeaseHandler // lease mode: lease.Work is set
	inbox   bool         // accepted first, applied by the Processor's queue
}

// isLease reports whether r is a lease-mode route.
func (r route) isLease() bool { return r.lease.Work != nil }

// NewRoutes returns an empty registry.
func NewRoutes() *Routes {
	return &Routes{routes: make(map[routeKey]route)}
}

// Transactional registers h for source's events of eventType in
// transactional mode: h runs in the transaction that records the event's
// key, during the delivery (Processor.Process).
func (rs *Routes) Transactional(source, eventType string, h HandlerFunc) {
	rs.add(source, eventType, route{handler: h})
}

// Lease registers h for source's events of eventType in lease mode, for
// handlers with effects outside the database: h's work runs under a claim
// with a fencing token during the delivery, and its writes commit with the
// done mark (Processor.ProcessLease).
func (rs *Routes) Lease(source, eventType string, h LeaseHandler) {
	rs.add(source, eventType, route{lease: h})
}

// Inbox registers h for source's events of eventType in inbox mode: a
// delivery stores the event and its job and is acknowledged after that
// COMMIT; the job later applies the event with h in transactional mode. The
// Processor needs a queue for it (package inbox).
func (rs *Routes) Inbox(source, eventType string, h HandlerFunc) {
	rs.add(source, eventType, route{handler: h, inbox: true})
}

// InboxLease registers h for source's events of eventType in inbox mode with
// a lease-mode handler: the job applies the event under a claim, as Lease
// does during a delivery.
func (rs *Routes) InboxLease(source, eventType string, h LeaseHandler) {
	rs.add(source, eventType, route{lease: h, inbox: true})
}

func (rs *Routes) add(source, eventType string, r route) {
	if err := (Event{Source: source, Key: "k", Type: eventType}).Validate(); err != nil {
		panic(fmt.Sprintf("txhook: register route %q/%q: %v", source, eventType, err))
	}
	if r.isLease() {
		if _, err := r.lease.settings(); err != nil {
			panic(fmt.Sprintf("txhook: register route %q/%q: %v", source, eventType, err))
		}
	} else if r.handler == nil {
		panic(fmt.Sprintf("txhook: register route %q/%q: nil handler", source, eventType))
	}
	k := routeKey{source, eventType}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if _, dup := rs.routes[k]; dup {
		panic(fmt.Sprintf("txhook: register route %q/%q: registered twice", source, eventType))
	}
	rs.routes[k] = r
}

// lookup returns the route of source's events of eventType, else source's
// fallback; ok is false when there is neither. A nil *Routes has none.
func (rs *Routes) lookup(source, eventType string) (r route, ok bool) {
	if rs == nil {
		return route{}, false
	}
	rs.mu.RLock()
	defer rs.mu.RUnlock()
	if r, ok := rs.routes[routeKey{source, eventType}]; ok {
		return r, true
	}
	r, ok = rs.routes[routeKey{source, ""}]
	return r, ok
}

// hasSource reports whether any route is registered for source.
func (rs *Routes) hasSource(source string) bool {
	if rs == nil {
		return false
	}
	rs.mu.RLock()
	defer rs.mu.RUnlock()
	for k := range rs.routes {
		if k.source == source {
			return true
		}
	}
	return false
}

// inboxSources returns the sources with an inbox route, sorted.
func (rs *Routes) inboxSources() []string {
	if rs == nil {
		return nil
	}
	rs.mu.RLock()
	defer rs.mu.RUnlock()
	var out []string
	for k, r := range rs.routes {
		if r.inbox {
			out = append(out, k.source)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
