package txhook

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/txhook/txhook/db"
	"github.com/txhook/txhook/internal/engine"
)

// Errors of Replay. The event's row is left unchanged with each of them
// (but a stuck event's: see Replay).
var (
	// ErrNoPayload: the event's payload was not stored (Config.StorePayload
	// was off when it was delivered), so there is nothing to replay; ask the
	// provider to resend it instead.
	ErrNoPayload = errors.New("txhook: event has no stored payload")
	// ErrNoHandler: no route is registered for the event's source and type
	// (Config.Routes).
	ErrNoHandler = errors.New("txhook: no handler for event type")
	// ErrNotFailed: the event is not failed: in progress (held by a
	// lease-mode delivery whose claim is live, or whose route is not in
	// lease mode) or queued (inbox mode: its job, still live, applies it).
	ErrNotFailed = errors.New("txhook: event is not failed")
)

// Replay runs the failed event source/key (a dead letter) again through the
// route registered for its source and type (Config.Routes), from its stored
// payload, with the same exactly-once rules as a delivery. The console's
// Replay and the CLI's replay come here.
//
// In one transaction it locks the failed row, runs the route's handler on
// the stored payload and marks the row done, so the handler's writes and the
// new status commit together, and two concurrent replays of one event run
// the handler once: the second waits for the first and finds the event done.
// Outcomes:
//   - OutcomeProcessed: the handler succeeded; the event is done.
//   - OutcomeDuplicate: the event was already done (replayed meanwhile);
//     nothing ran.
//   - OutcomeFailed: the handler failed permanently again; its writes were
//     rolled back and the event stays failed with the new error (Result.Err)
//     and one more attempt.
//
// Any error means nothing changed (but for a stuck event, below): the event
// is not found (ErrEventNotFound), in progress or queued (ErrNotFailed),
// without a stored payload (ErrNoPayload) or without a route
// (ErrNoHandler), or the handler returned an error that is not permanent,
// which rolls everything back and leaves the event failed as it was. A
// *CommitUnknownError means the outcome cannot be known.
//
// An event whose route is in lease mode (Lease, InboxLease) is replayed
// under a new claim (one more attempt), as ProcessLease would run it; a
// handler error that is not permanent is returned and the event stays
// failed, with the new error, for a later replay. A lease-mode event left in
// progress with its lease ended (its worker died, or released the claim
// after an error and the sender never retried) is replayed the same way,
// its claim taken over; while a claim is live the result is OutcomeInFlight
// and nothing ran.
//
// An inbox event that is stuck (queued, or in progress with its lease ended,
// while its River job is gone, completed, discarded or cancelled: see
// FailStuck) is first recorded as failed, as FailStuck does, its row locked
// and checked, and then replayed as a dead letter: it stays one if the
// replay fails. An event whose job is still live is never taken over: its
// job applies it (ErrNotFailed while it is queued).
func (p *Processor) Replay(ctx context.Context, source, key string) (Result, error) {
	res, err := p.replay(ctx, source, key)
	if err != nil {
		return Result{}, fmt.Errorf("replay %s/%s: %w", source, key, err)
	}
	return res, nil
}

func (p *Processor) replay(ctx context.Context, source, key string) (Result, error) {
	if err := p.failStuck(ctx, source, key); err != nil {
		return Result{}, err
	}
	// The stored event, whose route decides how it is replayed.
	var cur db.TxhookProcessedEvent
	err := p.autocommit(ctx, func(ctx context.Context, q *db.Queries) error {
		var err error
		cur, err = q.GetEvent(ctx, db.GetEventParams{Source: source, EventKey: key})
		return err
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Result{}, ErrEventNotFound
	case err != nil:
		return Result{}, fmt.Errorf("read event: %w", err)
	}
	if r, ok := p.routes.lookup(source, cur.EventType); ok && r.isLease() &&
		(cur.Status == statusFailed || cur.Status == statusInProgress) {
		if cur.Payload == nil {
			return Result{}, ErrNoPayload
		}
		// Under a new claim: its statement waits on the row's lock at most
		// Config.LockTimeout (in flight past it), and a live claim is in
		// flight.
		return p.processLease(ctx, *eventOf(cur), r.lease, true, false)
	}
	var res Result
	var failed *db.TxhookProcessedEvent // the failed row, locked; nil when the event is not failed
	err = engine.Run(ctx, engine.Begin(p.db), p.run, engine.Spec{
		First: func(ctx context.Context, q engine.Querier) error {
			failed = nil // a retried transaction starts afresh
			row, err := db.New(q).LockFailedEvent(ctx, db.LockFailedEventParams{Source: source, EventKey: key})
			switch {
			case errors.Is(err, pgx.ErrNoRows):
			case err != nil:
				return fmt.Errorf("lock failed event: %w", err)
			default:
				failed = &row
			}
			return nil
		},
		Body: func(ctx context.Context, tx pgx.Tx) error {
			var err error
			res, err = p.replayTx(ctx, tx, failed, source, key)
			return err
		},
	})
	if err != nil && !errors.Is(err, errRollback) {
		return Result{}, err
	}
	return res, nil
}

// failStuck records the event source/key as failed when it is a stuck inbox
// event (see FailStuck), so that it is replayed as a dead letter.
func (p *Processor) failStuck(ctx context.Context, source, key string) error {
	err := p.autocommit(ctx, func(ctx context.Context, q *db.Queries) error {
		_, err := q.FailStuckEvents(ctx, db.FailStuckEventsParams{Source: optText(source), EventKey: optText(key)})
		return err
	})
	if err != nil {
		return fmt.Errorf("take over stuck event: %w", err)
	}
	return nil
}

// replayTx is the body of Replay's transaction: row is the failed event,
// locked by the transaction's first step, or nil when it is not failed.
func (p *Processor) replayTx(ctx context.Context, tx pgx.Tx, row *db.TxhookProcessedEvent, source, key string) (Result, error) {
	q := db.New(tx)
	ids := db.GetEventParams{Source: source, EventKey: key}
	if row == nil {
		cur, err := q.GetEvent(ctx, ids)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return Result{}, ErrEventNotFound
		case err != nil:
			return Result{}, fmt.Errorf("read event: %w", err)
		case cur.Status == statusDone:
			return Result{Outcome: OutcomeDuplicate}, errRollback
		}
		return Result{}, ErrNotFailed
	}
	r, ok := p.routes.lookup(source, row.EventType)
	switch {
	case row.Payload == nil:
		return Result{}, ErrNoPayload
	case !ok || r.isLease(): // a lease route registered meanwhile: the next replay runs it
		return Result{}, fmt.Errorf("%w %q", ErrNoHandler, row.EventType)
	}
	ev := eventOf(*row)
	herr := RunTx(ctx, tx, func(ctx context.Context, tx pgx.Tx) error { return r.handler(ctx, tx, *ev) })
	if herr != nil {
		if !IsPermanent(herr) {
			return Result{}, fmt.Errorf("handle event: %w", herr)
		}
		if _, err := q.RecordReplayFailure(ctx, db.RecordReplayFailureParams{
			LastError: pgtype.Text{String: errorText(herr), Valid: true},
			Source:    source,
			EventKey:  key,
		}); err != nil {
			return Result{}, fmt.Errorf("record replay failure: %w", err)
		}
		return Result{Outcome: OutcomeFailed, Err: herr}, nil
	}
	n, err := q.MarkReplayed(ctx, db.MarkReplayedParams(ids))
	if err != nil {
		return Result{}, fmt.Errorf("mark event done: %w", err)
	}
	if n != 1 {
		// The row is locked by this transaction; this cannot happen.
		return Result{}, fmt.Errorf("mark event done: %d rows updated", n)
	}
	return Result{Outcome: OutcomeProcessed}, nil
}

// eventOf is the event a stored row records.
func eventOf(row db.TxhookProcessedEvent) *Event {
	return &Event{Source: row.Source, Key: row.EventKey, Type: row.EventType, Payload: row.Payload, PayloadHash: row.PayloadHash}
}

// ReplayReport is the result of replaying one event in ReplayFailed.
type ReplayReport struct {
	Source string
	Key    string
	Type   string
	// Result is Replay's result, valid when Err is nil.
	Result Result
	// Err is Replay's error; the event is left as Replay says.
	Err error
}

// ReplayFailed replays the failed events that f selects, oldest first, each
// in its own transaction (see Replay), and reports on each. One event's
// error does not stop the others. The returned error is set only when the
// events cannot be listed or ctx ends; the reports then cover the events
// replayed so far.
func (p *Processor) ReplayFailed(ctx context.Context, f EventFilter) ([]ReplayReport, error) {
	var events []EventRecord
	o := p.run
	o.Tx.AccessMode = pgx.ReadOnly
	err := engine.Run(ctx, engine.Begin(p.db), o, engine.Spec{Body: func(ctx context.Context, tx pgx.Tx) error {
		var err error
		events, err = ListDeadLetters(ctx, tx, f)
		return err
	}})
	if err != nil {
		return nil, fmt.Errorf("replay failed events: %w", err)
	}
	reports := make([]ReplayReport, 0, len(events))
	for _, ev := range events {
		if err := ctx.Err(); err != nil {
			return reports, fmt.Errorf("replay failed events: %w", err)
		}
		res, err := p.Replay(ctx, ev.Source, ev.Key)
		reports = append(reports, ReplayReport{Source: ev.Source, Key: ev.Key, Type: ev.Type, Result: res, Err: err})
	}
	return reports, nil
}
