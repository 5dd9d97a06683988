package txhook

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// OutcomeIgnored: no route is registered for the event's source and type
// (nor a fallback for its source); no handler ran and nothing was written,
// unless a body dedupe recorded the delivery's key and body hash
// (DeliverOptions.BodyDedupe). The sender may be acknowledged.
const OutcomeIgnored = OutcomeQueued + 1

// DeliverOptions configures one call of Deliver. The zero value (or nil)
// gives the defaults.
type DeliverOptions struct {
	// BodyDedupe, if set, refuses a signed body received before under
	// another key (see BodyDedupe), checked inside the transaction or claim
	// that records the event; a delivery without a route is then recorded
	// too (its key and body hash, as done), so that its body cannot pass
	// later under a routed type. Defaults to nil: no check.
	BodyDedupe *BodyDedupe
	// Ignore says that the delivery carries no event to apply, whatever
	// routes are registered (a provider's connectivity check, such as
	// GitHub's ping): it is answered OutcomeIgnored, and recorded when
	// BodyDedupe is set. Defaults to false.
	Ignore bool
	// LastAttempt says that the sender will not deliver the event again (a
	// broker's last redelivery): a handler error then records the event as
	// failed, a dead letter that an operator can replay, instead of being
	// returned for a retry that will never come. An error that says the
	// database could not be used, or a commit of unknown outcome, is still
	// returned: nothing could be recorded. Defaults to false.
	LastAttempt bool
}

// Queue holds the events of inbox routes until their jobs apply them.
// Package inbox implements it on River and gives itself to the Processor
// (UseQueue); the job applies the event with Processor.ApplyQueued, in the
// mode of the event's route.
type Queue interface {
	// Enqueue inserts, in tx, the job that will apply ev, and returns its
	// id, which is recorded with the event. tx is the transaction that
	// records ev as queued; Enqueue runs before ev's key is known to be
	// new, so it must write only through tx (River's InsertTx does): a
	// duplicate rolls its job back.
	Enqueue(ctx context.Context, tx pgx.Tx, ev Event) (jobID int64, err error)
}

// errNoQueue is Deliver's error for an inbox route on a Processor that has
// no queue.
var errNoQueue = errors.New("txhook: inbox route, but the processor has no queue (create the inbox with package inbox)")

// UseQueue makes q the queue of the Processor's inbox routes. Package inbox
// calls it when it creates an Inbox; a Processor has at most one queue.
func (p *Processor) UseQueue(q Queue) error {
	if q == nil {
		return errors.New("txhook: use queue: nil queue")
	}
	if !p.queue.CompareAndSwap(nil, &q) {
		return errors.New("txhook: use queue: the processor already has a queue")
	}
	return nil
}

// HasRoutes reports whether the Processor's routes (Config.Routes) hold a
// route for source, its fallback included: an endpoint or a consumer for a
// source without one would acknowledge every event and apply none.
func (p *Processor) HasRoutes(source string) bool { return p.routes.hasSource(source) }

// Deliver applies ev through the route registered for its source and type
// (Config.Routes), in the route's mode:
//   - transactional: as Process, with the route's handler;
//   - lease: as ProcessLease;
//   - inbox: the event and its job are recorded in one transaction and
//     OutcomeQueued is returned; the job applies the event later
//     (ApplyQueued). Duplicates and in-flight keys are answered as by
//     Process.
//
// An event without a route is answered OutcomeIgnored, nothing run. With
// DeliverOptions.BodyDedupe, a body received before under another key is
// answered with a *DuplicateBodyError, nothing run or written, and a wait
// past its LockTimeout for another delivery of the same body
// OutcomeInFlight.
//
// Deliver is what the HTTP endpoint and the queue consumers call for every
// verified delivery; outcomes and errors are those of the mode's method,
// and an event must be acknowledged only for a nil error (and never for
// OutcomeInFlight). ctx bounds the work up to COMMIT.
func (p *Processor) Deliver(ctx context.Context, ev Event, opts *DeliverOptions) (Result, error) {
	res, err := p.deliver(ctx, ev, opts)
	if errors.Is(err, errBodyInFlight) {
		// Another delivery of the same body holds body dedupe's lock.
		return Result{Outcome: OutcomeInFlight, RetryAfter: opts.BodyDedupe.lockTimeout()}, nil
	}
	return res, err
}

func (p *Processor) deliver(ctx context.Context, ev Event, opts *DeliverOptions) (Result, error) {
	var o DeliverOptions
	if opts != nil {
		o = *opts
	}
	r, ok := p.routes.lookup(ev.Source, ev.Type)
	if o.Ignore {
		ok = false
	}
	g := o.BodyDedupe
	switch {
	case !ok && g == nil:
		if err := ev.validate(p.maxKeyLen); err != nil {
			return Result{}, err
		}
		return Result{Outcome: OutcomeIgnored}, nil
	case !ok:
		res, err := p.process(ctx, ev, g.handler(recordOnly), false)
		if err == nil && res.Outcome == OutcomeProcessed {
			res.Outcome = OutcomeIgnored
		}
		return res, err
	case r.inbox:
		qp := p.queue.Load()
		if qp == nil {
			return Result{}, fmt.Errorf("deliver %s event %q: %w", ev.Source, ev.Type, errNoQueue)
		}
		return p.accept(ctx, ev, g, *qp)
	case r.isLease():
		h := r.lease
		if g != nil {
			h = g.lease(h)
		}
		return p.processLease(ctx, ev, h, false, o.LastAttempt)
	}
	h := r.handler
	if g != nil {
		h = g.handler(h)
	}
	return p.process(ctx, ev, h, o.LastAttempt)
}

// recordOnly is the handler of a guarded delivery without a route: the
// transaction records the key and body hash, nothing else.
func recordOnly(context.Context, pgx.Tx, Event) error { return nil }

// onLastAttempt returns how a handler's error ends a delivery that the
// sender will not repeat: made permanent, so that the event is recorded as
// failed, unless it is permanent already, a lost claim (the new owner
// decides), a fault of the database, which nothing could record, or the
// work cut short by ctx's cancellation (a shutdown, not the handler's
// failure).
func onLastAttempt(ctx context.Context, last bool) func(error) error {
	if !last {
		return nil
	}
	return func(err error) error {
		if IsPermanent(err) || errors.Is(err, ErrLeaseLost) || databaseFault(err) || cancelled(ctx) {
			return err
		}
		return Permanent(err)
	}
}
