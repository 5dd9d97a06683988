package txhook

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/txhook/txhook/db"
	"github.com/txhook/txhook/internal/crash"
	"github.com/txhook/txhook/internal/engine"
)

// DefaultLease is the lease of a LeaseHandler that does not set one.
const DefaultLease = 30 * time.Second

// ErrLeaseLost reports that a delivery no longer holds its claim on an
// event: the lease ran out (and another delivery may have taken the event
// over) or a newer claim replaced it. Nothing the delivery wrote in phase two
// committed. The event must not be acknowledged: the sender's retry finds it
// done, in flight, or claimable.
var ErrLeaseLost = errors.New("txhook: lease lost")

// Claim is a delivery's hold on an event in lease mode.
type Claim struct {
	// Source and Key identify the event.
	Source string
	Key    string
	// Token is the fencing token of this claim: the event's attempt number,
	// 1 for the first claim and one more for every later claim (a takeover
	// after a lease ran out, a retry after a handler error, a replay). Every
	// write the processor makes for this claim is conditional on it and on
	// when the claim was made.
	Token int

	// claimedAt is the row's claimed_at as this claim set it, on the
	// database's clock. The token starts again at 1 when the row is deleted
	// (a discarded dead letter, pruning) and the key is claimed anew, so
	// every write for the claim is conditional on both. A Claim the
	// processor did not make has none, and no write matches it.
	claimedAt pgtype.Timestamptz
}

// IdempotencyKey returns the idempotency key of the step named step of the
// claimed event; see the package-level IdempotencyKey.
func (c Claim) IdempotencyKey(step string) string {
	return IdempotencyKey(c.Source, c.Key, step)
}

// LeaseFunc is phase one of a lease-mode handler: the work outside the
// database (HTTP calls, email, queues). It returns phase two, or nil when
// there is nothing to write besides the done mark. Phase two makes the
// event's business writes on tx, the transaction that also marks the event
// done, conditional on the claim's fencing token: both commit or neither
// does, and neither does if the claim was lost. Its writes may be deferred
// (Deferred) like a transactional handler's.
//
// ctx is cancelled when the claim is lost or its lease runs out without
// renewal; context.Cause(ctx) is then ErrLeaseLost. Pass ctx to every
// external call so that a worker that lost its claim stops early.
//
// The work may run more than once for one event: a worker can die after the
// external call and before phase two commits, and the next claim runs the
// work again. Pass c.IdempotencyKey(step) to every external call that accepts
// one (Stripe's Idempotency-Key header, a message id) so that the receiver
// drops the repeats.
//
// An error releases the claim at once and is returned by ProcessLease (the
// sender's retry claims the event again; a replay's claim records the event
// as failed again instead, see Processor.Replay); an error wrapped with Permanent
// records the event as failed.
type LeaseFunc func(ctx context.Context, c Claim, ev Event) (TxFunc, error)

// LeaseHandler is a handler for lease mode (ProcessLease): for events whose
// effects reach outside the database.
type LeaseHandler struct {
	// Work is the handler. Required.
	Work LeaseFunc
	// Lease is how long a claim holds an event before another delivery may
	// take it over. It must exceed the time the work takes (or the renewal
	// period, when renewal is on), and it is how long an event stays blocked
	// when the worker holding it dies. Defaults to DefaultLease (30s).
	Lease time.Duration
	// RenewEvery is the heartbeat period: while Work runs, the claim is
	// renewed for another Lease this often, fenced by the claim's token.
	// Defaults to Lease/3. A negative value turns renewal off: Work's context
	// then has a deadline at the end of the lease.
	RenewEvery time.Duration

	guard *BodyDedupe // checked inside the claim; see BodyDedupe.claimGuarded
}

type leaseSettings struct {
	lease      time.Duration
	renewEvery time.Duration // <= 0: no renewal
}

func (h LeaseHandler) settings() (leaseSettings, error) {
	s := leaseSettings{lease: h.Lease, renewEvery: h.RenewEvery}
	switch {
	case h.Work == nil:
		return s, errors.New("txhook: lease handler: nil Work")
	case s.lease < 0:
		return s, errors.New("txhook: lease handler: negative Lease")
	case s.lease == 0:
		s.lease = DefaultLease
	}
	if s.lease < time.Millisecond {
		return s, errors.New("txhook: lease handler: Lease shorter than 1ms")
	}
	switch {
	case s.renewEvery == 0:
		s.renewEvery = s.lease / 3
	case s.renewEvery >= s.lease:
		return s, errors.New("txhook: lease handler: RenewEvery not shorter than Lease")
	}
	return s, nil
}

// ProcessLease applies ev exactly once with a handler whose effects reach
// outside the database. It claims ev's key for h.Lease and returns the
// fencing token of the claim; runs h.Work (phase one) while renewing the
// claim; then, in one transaction, marks the event done, conditional on the
// token, and runs the TxFunc it returned (phase two).
//
// A nil error comes with one of the outcomes:
//   - processed: this delivery claimed the event and committed phase two;
//   - duplicate: the event is done (in either mode) or recorded as failed;
//     nothing ran;
//   - in flight: another delivery holds a live claim; nothing ran.
//     RetryAfter is the time until its lease ends, rounded up to whole
//     seconds (at least 1s). Never acknowledge this outcome as success;
//   - failed: h returned a PermanentError; the event is recorded as failed
//     with the error, for an operator to replay (Replay).
//
// An error means this delivery committed nothing, except a
// *CommitUnknownError; in every case the event must not be acknowledged. A
// handler error releases the claim at once, records the error and is
// returned wrapped. A delivery whose claim was lost (its lease ran out and
// another delivery took the event over) gets an error matching ErrLeaseLost
// and its phase-two writes are rolled back. A panic in h rolls back, releases
// the claim like an error and is re-raised. Invalid input returns an error
// and writes nothing.
//
// ctx bounds the claim, phase one and phase two up to COMMIT. Releasing a
// claim after an error runs even when ctx is cancelled.
func (p *Processor) ProcessLease(ctx context.Context, ev Event, h LeaseHandler) (Result, error) {
	return p.processLease(ctx, ev, h, false, false)
}

// processLease is ProcessLease; lastAttempt records a handler's error as
// failed (see DeliverOptions.LastAttempt). With replay set it is an
// operator's replay (Replay): besides everything ProcessLease may claim, it
// also claims an event recorded as failed and runs h for it again, under a
// new fencing token. A done event is still a duplicate and a live claim
// still in flight. A handler error that is not permanent is returned,
// wrapped, but the claim ends by recording the event as failed with the new
// error (fenced by the token, payload kept) rather than by releasing it: no
// sender retries a dead letter, so it stays one for a later replay.
func (p *Processor) processLease(ctx context.Context, ev Event, h LeaseHandler, replay, lastAttempt bool) (Result, error) {
	s, err := h.settings()
	if err != nil {
		return Result{}, err
	}
	if err := ev.validate(p.maxKeyLen); err != nil {
		return Result{}, err
	}

	started := time.Now() // before the claim: the local lease never outlasts the database's
	row, err := p.claim(ctx, ev, s.lease, replay, h.guard)
	switch {
	case isLockTimeout(err):
		return Result{Outcome: OutcomeInFlight, RetryAfter: p.inFlightWait}, nil
	case err != nil:
		return Result{}, fmt.Errorf("claim event: %w", err)
	case !row.Claimed && row.Status == statusInProgress:
		return Result{Outcome: OutcomeInFlight, RetryAfter: roundUpSeconds(time.Duration(row.RetryAfterMs) * time.Millisecond)}, nil
	case !row.Claimed:
		return Result{Outcome: OutcomeDuplicate}, nil
	}
	c := Claim{Source: ev.Source, Key: ev.Key, Token: int(row.Attempts), claimedAt: row.ClaimedAt}
	return p.runClaim(ctx, c, ev, s, started, replay, h.Work, onLastAttempt(ctx, lastAttempt))
}

// runClaim runs an event claimed as c: phase one (work) under the lease,
// renewed as s says from started (the local time just before the claim),
// then phase two in one transaction: the done mark first, so that a lost
// claim is found before the business writes and the row stays locked against
// takeovers until COMMIT (it travels with BEGIN), then work's writes. An error or a
// panic ends the claim (leaseFailed, which replay, set for an operator's
// replay, passes on), after failWrap, when set, has had its say (inbox mode
// makes its last attempt's error permanent).
func (p *Processor) runClaim(ctx context.Context, c Claim, ev Event, s leaseSettings, started time.Time, replay bool,
	work LeaseFunc, failWrap func(error) error) (Result, error) {
	p.crash.At(crash.LeaseAfterClaim)
	failed := func(err error) (Result, error) {
		if failWrap != nil {
			err = failWrap(err)
		}
		return p.leaseFailed(ctx, c, ev.Payload, err, replay)
	}
	defer func() {
		// A panicking handler releases its claim like a failing one, so that
		// the retry need not wait for the lease to run out.
		if v := recover(); v != nil {
			err := fmt.Errorf("handler panicked: %v", v)
			if failWrap != nil {
				err = failWrap(err)
			}
			p.leaseFailed(ctx, c, ev.Payload, err, replay)
			panic(v)
		}
	}()

	// Phase one, under the lease.
	k := p.keepLease(ctx, c, s, started)
	var lost bool
	commit, err := func() (TxFunc, error) {
		defer func() { lost = k.stop() }()
		return work(k.ctx, c, ev)
	}()
	if err != nil {
		if lost {
			err = errors.Join(err, ErrLeaseLost)
		}
		return failed(err)
	}
	p.crash.At(crash.LeaseAfterExternal)

	// Phase two.
	err = engine.Run(ctx, engine.Begin(p.db), p.run, engine.Spec{
		First: func(ctx context.Context, q engine.Querier) error {
			n, err := db.New(q).CompleteLease(ctx, db.CompleteLeaseParams{
				Source: c.Source, EventKey: c.Key, Attempts: int32(c.Token), ClaimedAt: c.claimedAt,
			})
			switch {
			case err != nil:
				return fmt.Errorf("mark event done: %w", err)
			case n == 0:
				return ErrLeaseLost
			}
			return nil
		},
		Body: func(ctx context.Context, tx pgx.Tx) error {
			if commit != nil {
				if err := commit(ctx, tx); err != nil {
					if IsPermanent(err) {
						return err
					}
					return fmt.Errorf("commit event: %w", err)
				}
			}
			return nil
		},
		BeforeCommit: func() { p.crash.At(crash.LeaseBeforeCommit) },
	})
	switch {
	case err == nil:
		p.crash.At(crash.LeaseAfterCommit)
		return Result{Outcome: OutcomeProcessed}, nil
	case errors.Is(err, ErrLeaseLost):
		return Result{}, fmt.Errorf("complete event: %w", err)
	case errors.Is(err, ErrCommitUnknown):
		// The done mark may have committed; releasing would be fenced by the
		// status anyway, but the connection is likely gone: report as is.
		return Result{}, err
	}
	return failed(err)
}

// claim runs the claim statement in its own transaction, after g's check.
func (p *Processor) claim(ctx context.Context, ev Event, lease time.Duration, replay bool, g *BodyDedupe) (db.ClaimEventRow, error) {
	var row db.ClaimEventRow
	err := g.claimGuarded(ctx, p, ev, func(ctx context.Context, q *db.Queries) error {
		var err error
		row, err = q.ClaimEvent(ctx, db.ClaimEventParams{
			Source:      ev.Source,
			EventKey:    ev.Key,
			EventType:   ev.Type,
			Payload:     p.payload(ev),
			PayloadHash: ev.PayloadHash,
			LeaseMs:     durationMs(lease),
			ClaimFailed: replay,
			LockTimeout: p.lockTimeout,
		})
		return err
	})
	return row, err
}

// leaseFailed ends claim c after herr, an error from the handler or from
// phase two: a permanent error records the event as failed (with payload,
// for a replay), any other releases the claim at once, or, when replay is
// set, records the event as failed too but returns herr: the claim of an
// operator's replay took a dead letter, which no sender retries, and a
// released claim would leave it in progress with nobody to claim it. All
// are fenced by c (its token and the time of its claim).
func (p *Processor) leaseFailed(ctx context.Context, c Claim, payload []byte, herr error, replay bool) (Result, error) {
	text := pgtype.Text{String: errorText(herr), Valid: true}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.run.FinishTimeout)
	defer cancel()
	record := IsPermanent(herr) || replay // recorded as failed; otherwise released
	var n int64
	err := p.autocommit(ctx, func(ctx context.Context, q *db.Queries) error {
		var err error
		if record {
			n, err = q.FailLease(ctx, db.FailLeaseParams{
				Source: c.Source, EventKey: c.Key, Attempts: int32(c.Token), ClaimedAt: c.claimedAt,
				LastError: text, Payload: payload,
			})
		} else {
			n, err = q.ReleaseLease(ctx, db.ReleaseLeaseParams{
				Source: c.Source, EventKey: c.Key, Attempts: int32(c.Token), ClaimedAt: c.claimedAt,
				LastError: text,
			})
		}
		return err
	})
	if IsPermanent(herr) {
		switch {
		case err != nil:
			return Result{}, fmt.Errorf("record failed event: %w", errors.Join(err, herr))
		case n == 0:
			return Result{}, fmt.Errorf("record failed event: %w", errors.Join(ErrLeaseLost, herr))
		}
		return Result{Outcome: OutcomeFailed, Err: herr}, nil
	}
	switch {
	case err != nil && record:
		herr = errors.Join(herr, fmt.Errorf("record failed event: %w", err))
	case err != nil:
		herr = errors.Join(herr, fmt.Errorf("release claim: %w", err))
	case n == 0 && !errors.Is(herr, ErrLeaseLost):
		herr = errors.Join(herr, ErrLeaseLost)
	}
	return Result{}, fmt.Errorf("handle event: %w", herr)
}

// autocommit runs fn's statement on its own, outside any transaction when
// p's database can run statements (see engine.Autocommit).
func (p *Processor) autocommit(ctx context.Context, fn func(ctx context.Context, q *db.Queries) error) error {
	return engine.Autocommit(ctx, p.db, p.run, func(ctx context.Context, q engine.Querier) error {
		return fn(ctx, db.New(q))
	})
}

// leaseKeeper holds a claim while phase one runs: it gives the work a context
// that ends with the lease and, when renewal is on, renews the lease.
type leaseKeeper struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	stopHB context.CancelFunc
	done   chan struct{}
}

func (p *Processor) keepLease(parent context.Context, c Claim, s leaseSettings, started time.Time) *leaseKeeper {
	end := started.Add(s.lease)
	done := make(chan struct{})
	if s.renewEvery <= 0 {
		ctx, cancel := context.WithDeadlineCause(parent, end, ErrLeaseLost)
		close(done)
		return &leaseKeeper{ctx: ctx, cancel: func(error) { cancel() }, stopHB: func() {}, done: done}
	}
	ctx, cancel := context.WithCancelCause(parent)
	hbCtx, stopHB := context.WithCancel(ctx)
	k := &leaseKeeper{ctx: ctx, cancel: cancel, stopHB: stopHB, done: done}
	go p.heartbeat(hbCtx, k, c, s, end)
	return k
}

// heartbeat renews k's claim every s.renewEvery until ctx ends. It cancels
// the work's context with ErrLeaseLost when a renewal finds the claim gone,
// or when the lease runs out before a renewal succeeds.
func (p *Processor) heartbeat(ctx context.Context, k *leaseKeeper, c Claim, s leaseSettings, end time.Time) {
	defer close(k.done)
	expiry := time.NewTimer(time.Until(end))
	defer expiry.Stop()
	tick := time.NewTicker(s.renewEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-expiry.C:
			k.cancel(ErrLeaseLost)
			return
		case <-tick.C:
		}
		sent := time.Now()
		rctx, cancel := context.WithDeadline(ctx, end)
		var n int64
		err := p.autocommit(rctx, func(ctx context.Context, q *db.Queries) error {
			var err error
			n, err = q.RenewLease(ctx, db.RenewLeaseParams{
				Source: c.Source, EventKey: c.Key, Attempts: int32(c.Token), ClaimedAt: c.claimedAt,
				LeaseMs: durationMs(s.lease),
			})
			return err
		})
		cancel()
		switch {
		case err != nil:
			// Try again at the next tick; the expiry timer ends the work if
			// no renewal succeeds in time.
		case n == 0:
			k.cancel(ErrLeaseLost)
			return
		default:
			end = sent.Add(s.lease)
			expiry.Reset(time.Until(end))
		}
	}
}

// stop ends the heartbeat and the work's context. It reports whether the
// claim was lost (or its lease ran out) while the work ran.
func (k *leaseKeeper) stop() bool {
	k.stopHB()
	<-k.done
	lost := errors.Is(context.Cause(k.ctx), ErrLeaseLost)
	k.cancel(context.Canceled)
	return lost
}

func durationMs(d time.Duration) int64 {
	return max(int64((d+time.Millisecond-1)/time.Millisecond), 1)
}

// roundUpSeconds rounds d up to whole seconds, at least one: Retry-After
// counts whole seconds, and rounding down would ask for a retry before the
// lease ends.
func roundUpSeconds(d time.Duration) time.Duration {
	s := (d + time.Second - 1) / time.Second
	return max(s, 1) * time.Second
}

// IdempotencyKey returns a deterministic key for the step named step of the
// event (source, eventKey): the same on every delivery, retry, takeover and
// replay of the event, and different for every other source, event or step.
// Pass it to downstream APIs that deduplicate requests, such as Stripe's
// Idempotency-Key header, so that an external call repeated after a crash or
// a takeover takes effect once. Use one step name per distinct external call
// of a handler ("charge", "email-receipt").
//
// The key is "txh_" and 64 lowercase hex digits (68 bytes, within Stripe's
// 255), a SHA-256 of the length-prefixed inputs: it reveals nothing of the
// event and no two different inputs share a key by concatenation.
func IdempotencyKey(source, eventKey, step string) string {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, s := range [...]string{"txhook idempotency key v1", source, eventKey, step} {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		io.WriteString(h, s)
	}
	return "txh_" + hex.EncodeToString(h.Sum(nil))
}
