package txhook

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txhook/txhook/db"
	"github.com/txhook/txhook/internal/engine"
)

// defaultBodyDedupeLockTimeout is BodyDedupe.LockTimeout's default.
const defaultBodyDedupeLockTimeout = 2 * time.Second

// errBodyInFlight is matched by the error of a check that gave up
// waiting, past BodyDedupe.LockTimeout, for another delivery of the same
// body to finish: Deliver answers it OutcomeInFlight.
var errBodyInFlight = errors.New("txhook: a delivery of the same body is in flight")

// DuplicateBodyError reports that an event's PayloadHash is already
// recorded under another key of its source within BodyDedupe.Window: the
// delivery sends again, under a new key, a body received before. Nothing of
// the delivery ran or was written.
type DuplicateBodyError struct {
	// Key is the other key recorded with the same hash.
	Key string
}

// Error names the key the body was first recorded under.
func (e *DuplicateBodyError) Error() string {
	return "txhook: body already recorded under event key " + e.Key
}

// BodyDedupe dedupes deliveries by body as well as by key: it refuses a
// body already received under another key (a replay attack). Senders
// whose event keys are not signed (GitHub's X-GitHub-Delivery, Shopify's
// X-Shopify-Event-Id) let a captured body and signature pass dedupe again
// under a fresh key header; the guard catches that by Event.PayloadHash, a
// digest of the signed body that the caller computes and that is stored with
// the event's key.
//
// Deliver runs the check (DeliverOptions.BodyDedupe) inside the transaction
// that records the event: a transactional route's own, after its key is
// inserted; a lease route's claim; an inbox route's accept. It takes a
// transaction-level advisory lock on (source, hash), so that deliveries of
// one hash are checked one after another, then looks for another key of
// the source recorded with that hash within Window. The lock is held until
// the delivery's own row is committed (or the delivery ends), and the
// lookup, in a statement of its own, sees what committed while it waited:
// at READ COMMITTED, which the claim and the accept use; a transactional
// route's transaction runs at the processor's isolation level, where a
// stricter level sees only what committed before the transaction began. An
// event without a PayloadHash is not checked. The zero value is ready to
// use.
type BodyDedupe struct {
	// Window is how far back the guard looks. Pruning keeps rows for the
	// prune retention only, so a Window longer than the retention is
	// shortened to it in effect (see PrunerConfig.BodyDedupeWindow). Defaults
	// to DefaultRetention, so that the guard remembers every body whose
	// row default pruning keeps.
	Window time.Duration
	// LockTimeout bounds the wait for another delivery of the same hash;
	// past it the delivery is answered OutcomeInFlight, nothing run or
	// written. Defaults to 2s.
	LockTimeout time.Duration
}

// handler returns h with the guard's check in front: for Process, whose
// transaction has already recorded the event's key and hash when h runs, so
// the lock is held until that transaction ends. A replayed body makes the
// handler fail with a *DuplicateBodyError, and a wait past LockTimeout with
// errBodyInFlight; Process then rolls back and returns that error
// wrapped.
func (g BodyDedupe) handler(h HandlerFunc) HandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, ev Event) error {
		if err := g.check(ctx, tx, ev); err != nil {
			return err
		}
		return h(ctx, tx, ev)
	}
}

// lease returns h with the guard's check inside its claim: ProcessLease then
// takes the guard's lock, looks for the hash and claims the key in one
// transaction, so the claim (and with it the hash) is committed before the
// next delivery of the same body is checked. A replayed body makes
// ProcessLease return an error wrapping a *DuplicateBodyError, with nothing claimed
// and Work not run; a wait past LockTimeout is answered OutcomeInFlight.
func (g BodyDedupe) lease(h LeaseHandler) LeaseHandler {
	h.guard = &g
	return h
}

// lockTimeout is the guard's LockTimeout, or its default.
func (g *BodyDedupe) lockTimeout() time.Duration {
	if g == nil || g.LockTimeout <= 0 {
		return defaultBodyDedupeLockTimeout
	}
	return g.LockTimeout
}

// check takes the guard's lock for ev in q's transaction and looks for
// another key recorded with ev's hash.
func (g BodyDedupe) check(ctx context.Context, q db.DBTX, ev Event) error {
	if len(ev.PayloadHash) == 0 {
		return nil
	}
	other, err := db.New(q).LockAndFindPayloadHash(ctx, db.LockAndFindPayloadHashParams(g.params(ev)))
	switch {
	case err != nil:
		return g.failed(err)
	case other != "":
		return &DuplicateBodyError{Key: other}
	}
	return nil
}

// checkDeferred is check as a statement that fails (CheckBodyNotRecorded),
// queued on deferred, queries on a transaction's engine.Deferred, to travel
// with the next statement sent: inbox mode's accept sends it ahead of the
// job's insert. Its answer comes back as that statement's
// *engine.DeferredError, which failed turns into check's errors.
func (g BodyDedupe) checkDeferred(ctx context.Context, deferred *db.Queries, ev Event) error {
	if len(ev.PayloadHash) == 0 {
		return nil
	}
	return deferred.CheckBodyNotRecorded(ctx, g.params(ev))
}

// params are the check's arguments for ev.
func (g BodyDedupe) params(ev Event) db.CheckBodyNotRecordedParams {
	window, wait := g.Window, g.lockTimeout()
	if window <= 0 {
		window = DefaultRetention
	}
	return db.CheckBodyNotRecordedParams{
		Source:        ev.Source,
		PayloadHash:   ev.PayloadHash,
		EventKey:      ev.Key,
		WindowSeconds: window.Seconds(),
		LockTimeout:   fmt.Sprintf("%dms", max(wait.Milliseconds(), 1)),
	}
}

// failed is the check's error for err, the failure of its statement: a
// *DuplicateBodyError for another key recorded with the hash
// (checkDeferred's SQLSTATE P0T03), errBodyInFlight for a wait for the
// body's lock past its bound, err itself otherwise.
func (g BodyDedupe) failed(err error) error {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == sqlstateBodyRecorded {
		return &DuplicateBodyError{Key: pgErr.Detail}
	}
	if isReplayWait(err) {
		return fmt.Errorf("body dedupe: %w", errors.Join(errBodyInFlight, err))
	}
	return fmt.Errorf("body dedupe: %w", err)
}

// claimGuarded runs fn, lease mode's claim, after g's check in one
// transaction; with a nil g, or an event without a hash, it is
// p.autocommit.
func (g *BodyDedupe) claimGuarded(ctx context.Context, p *Processor, ev Event, fn func(ctx context.Context, q *db.Queries) error) error {
	if g == nil || len(ev.PayloadHash) == 0 {
		return p.autocommit(ctx, fn)
	}
	o := p.run
	o.Tx.IsoLevel = pgx.ReadCommitted // the lookup must see what committed while it waited
	return engine.Run(ctx, engine.Begin(p.db), o, engine.Spec{Body: func(ctx context.Context, tx pgx.Tx) error {
		// A wait past the bound keeps its SQLSTATE, which lease mode
		// answers as in flight like a wait in the claim itself.
		if err := g.check(ctx, tx, ev); err != nil {
			return err
		}
		return fn(ctx, db.New(tx))
	}})
}

// sqlstateReplayWait is the SQLSTATE with which txhook_find_replay answers
// a wait for the body's lock past the guard's LockTimeout.
const sqlstateReplayWait = "P0T02"

// sqlstateBodyRecorded is the SQLSTATE with which txhook_check_replay
// answers a body recorded under another key, that key its DETAIL.
const sqlstateBodyRecorded = "P0T03"

// isReplayWait reports whether err is the guard's wait for the body's lock
// running out (its own bound, or the session's statement_timeout): the
// delivery of the same body is in flight.
func isReplayWait(err error) bool {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == sqlstateReplayWait {
		return true
	}
	return isLockTimeout(err)
}
