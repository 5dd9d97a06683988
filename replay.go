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
	// ErrNoHandler: the lookup has no handler for the event's type.
	ErrNoHandler = errors.New("txhook: no handler for event type")
	// ErrNotFailed: the event is not failed: in progress (held by a
	// lease-mode delivery, and the Replayer knows no lease handler for its
	// type) or queued (inbox mode: its job, still live, applies it).
	ErrNotFailed = errors.New("txhook: event is not failed")
)

// HandlerLookup returns the application's handler for an event type, and
// false when it has none.
type HandlerLookup func(eventType string) (HandlerFunc, bool)

// LeaseLookup returns the application's lease-mode handler for an event
// type, and false when it has none.
type LeaseLookup func(eventType string) (LeaseHandler, bool)

// ReplayerConfig configures a Replayer. The zero value (or nil) gives the
// defaults.
type ReplayerConfig struct {
	// Tx configures the replay transactions. Defaults to the zero TxOptions.
	Tx *TxOptions
	// LeaseLookup, with Processor, lets the Replayer replay events of
	// lease-mode types: an event whose type the transactional lookup does
	// not know but LeaseLookup does is replayed with Processor.ReplayLease.
	// Defaults to nil: transactional handlers only.
	LeaseLookup LeaseLookup
	// Processor runs lease-mode replays. Required with LeaseLookup.
	Processor *Processor
}

// Replayer runs failed events (dead letters) again through the
// application's handlers, from their stored payloads, with the same
// exactly-once rules as a delivery. It is safe for concurrent use.
type Replayer struct {
	db          Beginner
	lookup      HandlerLookup
	leaseLookup LeaseLookup
	proc        *Processor
	run         engine.Options
}

// NewReplayer returns a Replayer that replays events in db with the handlers
// that lookup returns.
func NewReplayer(db Beginner, lookup HandlerLookup, cfg *ReplayerConfig) (*Replayer, error) {
	if db == nil {
		return nil, errors.New("txhook: new replayer: nil database")
	}
	if lookup == nil {
		return nil, errors.New("txhook: new replayer: nil handler lookup")
	}
	var c ReplayerConfig
	if cfg != nil {
		c = *cfg
	}
	if c.LeaseLookup != nil && c.Processor == nil {
		return nil, errors.New("txhook: new replayer: LeaseLookup needs Processor")
	}
	return &Replayer{db: db, lookup: lookup, leaseLookup: c.LeaseLookup, proc: c.Processor,
		run: c.Tx.engine()}, nil
}

// Replay runs the failed event source/key through the handler for its type.
//
// In one transaction it locks the failed row, runs the handler on the stored
// payload and marks the row done, so the handler's writes and the new status
// commit together, and two concurrent replays of one event run the handler
// once: the second waits for the first and finds the event done. Outcomes:
//   - OutcomeProcessed: the handler succeeded; the event is done.
//   - OutcomeDuplicate: the event was already done (replayed meanwhile);
//     nothing ran.
//   - OutcomeFailed: the handler failed permanently again; its writes were
//     rolled back and the event stays failed with the new error (Result.Err)
//     and one more attempt.
//
// Any error means nothing changed (but for a stuck event, below): the event
// is not found (ErrEventNotFound), in progress or queued (ErrNotFailed),
// without a stored payload (ErrNoPayload) or without a handler
// (ErrNoHandler), or the handler returned an error that is not permanent,
// which rolls everything back and leaves the event failed as it was. A *CommitUnknownError means the outcome cannot be known.
//
// An event of a lease-mode type (see ReplayerConfig.LeaseLookup) is replayed
// with Processor.ReplayLease instead, under a new claim (one more attempt);
// its outcomes are those of ProcessLease. A handler error that is not
// permanent is returned and the event stays failed, with the new error, for
// a later replay. A lease-mode event left in progress with its lease ended
// (its worker died, or released the claim after an error and the sender
// never retried) is replayed the same way, its claim taken over; while a
// claim is live the result is OutcomeInFlight and nothing ran.
//
// An inbox event that is stuck (queued, or in progress with its lease ended,
// while its River job is gone, completed, discarded or cancelled: see
// Processor.FailStuck) is first recorded as failed, as FailStuck does, its
// row locked and checked, and then replayed as a dead letter: it stays one
// if the replay fails. An event whose job is still live is never taken
// over: its job applies it (ErrNotFailed while it is queued).
func (r *Replayer) Replay(ctx context.Context, source, key string) (Result, error) {
	if err := r.failStuck(ctx, source, key); err != nil {
		return Result{}, fmt.Errorf("replay %s/%s: %w", source, key, err)
	}
	if r.leaseLookup != nil {
		if res, ok, err := r.replayLease(ctx, source, key); ok {
			return res, err
		}
	}
	var res Result
	var failed *db.TxhookProcessedEvent // the failed row, locked; nil when the event is not failed
	err := engine.Run(ctx, engine.Begin(r.db), r.run, engine.Spec{
		First: func(ctx context.Context, q engine.Querier) error {
			row, err := db.New(q).LockFailedEvent(ctx, db.LockFailedEventParams{Source: source, EventKey: key})
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				failed = nil
			case err != nil:
				return fmt.Errorf("lock failed event: %w", err)
			default:
				failed = &row
			}
			return nil
		},
		Body: func(ctx context.Context, tx pgx.Tx) error {
			var err error
			res, err = r.replayTx(ctx, tx, failed, source, key)
			return err
		},
	})
	switch {
	case err == nil:
		return res, nil
	case errors.Is(err, errRollback):
		return res, nil
	}
	return Result{}, fmt.Errorf("replay %s/%s: %w", source, key, err)
}

// failStuck records the event source/key as failed when it is a stuck inbox
// event (see Processor.FailStuck), so that it is replayed as a dead letter.
func (r *Replayer) failStuck(ctx context.Context, source, key string) error {
	err := RunTx(ctx, r.db, &TxOptions{FinishTimeout: r.run.FinishTimeout}, func(ctx context.Context, tx pgx.Tx) error {
		_, err := db.New(tx).FailStuckEvents(ctx, db.FailStuckEventsParams{Source: optText(source), EventKey: optText(key)})
		return err
	})
	if err != nil {
		return fmt.Errorf("take over stuck event: %w", err)
	}
	return nil
}

// replayLease replays a failed event of a lease-mode type, or one whose
// claim was abandoned (in progress, its lease ended): ReplayLease takes the
// claim over, or answers in flight while it is live. ok is false when the
// event is not one: the transactional path then decides.
func (r *Replayer) replayLease(ctx context.Context, source, key string) (res Result, ok bool, err error) {
	var row db.TxhookProcessedEvent
	err = RunTx(ctx, r.db, &TxOptions{AccessMode: pgx.ReadOnly, FinishTimeout: r.run.FinishTimeout},
		func(ctx context.Context, tx pgx.Tx) error {
			var err error
			row, err = db.New(tx).GetEvent(ctx, db.GetEventParams{Source: source, EventKey: key})
			return err
		})
	if err != nil || (row.Status != statusFailed && row.Status != statusInProgress) {
		return Result{}, false, nil // not found, or neither failed nor claimed: as the transactional path says
	}
	if _, isTx := r.lookup(row.EventType); isTx {
		return Result{}, false, nil
	}
	h, isLease := r.leaseLookup(row.EventType)
	if !isLease {
		return Result{}, false, nil
	}
	if row.Payload == nil {
		return Result{}, true, fmt.Errorf("replay %s/%s: %w", source, key, ErrNoPayload)
	}
	ev := Event{Source: row.Source, Key: row.EventKey, Type: row.EventType, Payload: row.Payload, PayloadHash: row.PayloadHash}
	res, err = r.proc.ReplayLease(ctx, ev, h)
	if err != nil {
		return Result{}, true, fmt.Errorf("replay %s/%s: %w", source, key, err)
	}
	return res, true, nil
}

// replayTx is the body of Replay's transaction: row is the failed event,
// locked by the transaction's first step, or nil when it is not failed.
func (r *Replayer) replayTx(ctx context.Context, tx pgx.Tx, row *db.TxhookProcessedEvent, source, key string) (Result, error) {
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
	if row.Payload == nil {
		return Result{}, ErrNoPayload
	}
	h, ok := r.lookup(row.EventType)
	if !ok || h == nil {
		return Result{}, fmt.Errorf("%w %q", ErrNoHandler, row.EventType)
	}
	ev := Event{Source: row.Source, Key: row.EventKey, Type: row.EventType, Payload: row.Payload, PayloadHash: row.PayloadHash}
	herr := RunNestedTx(ctx, tx, func(ctx context.Context, tx pgx.Tx) error { return h(ctx, tx, ev) })
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
func (r *Replayer) ReplayFailed(ctx context.Context, f DeadLetterFilter) ([]ReplayReport, error) {
	var events []EventRecord
	err := RunTx(ctx, r.db, &TxOptions{AccessMode: pgx.ReadOnly, FinishTimeout: r.run.FinishTimeout},
		func(ctx context.Context, tx pgx.Tx) error {
			var err error
			events, err = ListDeadLetters(ctx, tx, f)
			return err
		})
	if err != nil {
		return nil, fmt.Errorf("replay failed events: %w", err)
	}
	reports := make([]ReplayReport, 0, len(events))
	for _, ev := range events {
		if err := ctx.Err(); err != nil {
			return reports, fmt.Errorf("replay failed events: %w", err)
		}
		res, err := r.Replay(ctx, ev.Source, ev.Key)
		reports = append(reports, ReplayReport{Source: ev.Source, Key: ev.Key, Type: ev.Type, Result: res, Err: err})
	}
	return reports, nil
}
