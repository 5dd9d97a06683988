package txhook

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/txhook/txhook/db"
	"github.com/txhook/txhook/internal/crash"
	"github.com/txhook/txhook/internal/engine"
)

// Inbox mode keeps the retry on the receiving side, for senders that never
// retry (GitHub) or give up fast (Shopify), and for handlers slower than the
// sender's timeout. A delivery is accepted: its event row is stored with
// status queued, payload and payload hash, together with a job in the
// application's queue, and the sender is answered 2xx only after that
// COMMIT. The queue's worker then applies the event: in one transaction it
// locks the row, runs the route's handler and marks the row done; the queue
// completes its job afterwards.
// The queue owns retries, backoff, the rescue of dead workers and shutdown;
// txhook owns the dedupe and the exactly-once apply. Package
// github.com/txhook/txhook/inbox runs it on River.

// OutcomeQueued: the event was accepted in inbox mode: its row (status
// queued) and its job are committed, and the job applies it later. The
// sender may be acknowledged.
const OutcomeQueued = OutcomeFailed + 1

// statusQueued is the status of an event accepted in inbox mode and not
// yet applied.
const statusQueued = "queued"

// accept records ev as queued and enqueues its job in q, in one transaction
// of its own: Deliver's inbox mode. It takes two round trips: a check that
// the key is not recorded yet (and the body dedupe's, with one) and the
// job's insert travel with BEGIN; the row's insert, with the job's id,
// travels with COMMIT, so the row is written once. The payload and payload
// hash are stored whatever Config.StorePayload says: the job reads the
// payload from the row (its arguments name only the source and key).
//
// A nil error comes with one of the outcomes:
//   - queued: the key was new; the row and the job are committed, and the
//     sender may be acknowledged;
//   - duplicate: the key exists, queued, in progress, done or failed; the
//     check answered so in the first round trip, before the server ran the
//     job's insert (a redelivery inserts no job and writes nothing), or,
//     for a key recorded by a concurrent delivery meanwhile, the row's
//     insert did with COMMIT's round trip; nothing was committed, and a job
//     q inserted rolled back with the rest;
//   - in flight: a concurrent delivery of the same key holds it, past
//     Config.LockTimeout; nothing was committed. Never acknowledge it.
//
// With a BodyDedupe, its check travels after the key's, ahead of the job's
// insert: a body recorded under another key fails it (a *DuplicateBodyError,
// no job inserted, nothing written); its lock is held until COMMIT, with
// which the row is inserted, so the next delivery of the same body finds
// the row. A concurrent delivery of the same key then waits at the guard's
// lock (bounded by BodyDedupe.LockTimeout, past which it is answered in
// flight) before it is answered a duplicate.
// Any error means nothing was committed (a *CommitUnknownError: the outcome
// cannot be known), and the sender must not be acknowledged; a database
// that cannot be used gives an *UnavailableError. ctx bounds the work up to
// COMMIT.
func (p *Processor) accept(ctx context.Context, ev Event, g *BodyDedupe, q Queue) (Result, error) {
	if err := ev.validate(p.maxKeyLen); err != nil {
		return Result{}, err
	}
	o := p.run
	if g != nil {
		o.Tx.IsoLevel = pgx.ReadCommitted // the guard's lookup must see what committed while it waited
	}
	err := engine.Run(ctx, engine.Begin(p.db), o, engine.Spec{
		Body: func(ctx context.Context, tx pgx.Tx) error {
			deferred := db.New(engine.Deferred(tx))
			// A recorded key fails this check, which travels with BEGIN
			// ahead of the job's insert: the server skips what follows it
			// in that round trip, so a redelivery inserts no job and
			// writes nothing.
			if err := deferred.CheckKeyNotRecorded(ctx, db.CheckKeyNotRecordedParams{Source: ev.Source, EventKey: ev.Key}); err != nil {
				return err
			}
			if g != nil {
				// So does the body dedupe's, sent next: a replayed body
				// fails it. Its lock is held until COMMIT, which the row
				// travels with: the next delivery of the body sees it.
				if err := g.checkDeferred(ctx, deferred, ev); err != nil {
					return err
				}
			}
			id, err := q.Enqueue(ctx, tx, ev)
			if err != nil {
				return fmt.Errorf("enqueue event: %w", err)
			}
			return deferred.QueueEventWithJob(ctx, db.QueueEventWithJobParams{
				Source: ev.Source, EventKey: ev.Key, EventType: ev.Type, Payload: ev.Payload,
				PayloadHash: ev.PayloadHash, JobID: id, LockTimeout: p.lockTimeout,
			})
		},
	})
	if err == nil {
		return Result{Outcome: OutcomeQueued}, nil
	}
	if de, ok := errors.AsType[*engine.DeferredError](err); ok {
		// The key's check or the body dedupe's, sent with BEGIN, or the
		// row's insert, sent with COMMIT, answered: nothing committed.
		switch pgErr, _ := errors.AsType[*pgconn.PgError](de); {
		case pgErr != nil && (pgErr.Code == sqlstateKeyExists || isEventsKeyConflict(pgErr)):
			return Result{Outcome: OutcomeDuplicate}, nil
		case g != nil && pgErr != nil && (pgErr.Code == sqlstateBodyRecorded || pgErr.Code == sqlstateReplayWait):
			return Result{}, g.failed(de)
		case isLockTimeout(de):
			return Result{Outcome: OutcomeInFlight, RetryAfter: p.inFlightWait}, nil
		}
	}
	return Result{}, err
}

// eventsKey is the events table's primary key, (source, event_key).
const eventsKey = "txhook_processed_events_pkey"

// isEventsKeyConflict reports whether pgErr is an insert's conflict on the
// events table's key: the key is recorded. A unique violation of any other
// index (the application's, the queue's) is not.
func isEventsKeyConflict(pgErr *pgconn.PgError) bool {
	return pgErr.Code == pgerrcode.UniqueViolation && pgErr.ConstraintName == eventsKey
}

// QueuedJob is the queue job that applies one accepted event.
type QueuedJob struct {
	// Source and Key name the event.
	Source, Key string
	// LastAttempt reports that the queue will not run the job again: a
	// handler error then records the event as failed instead of being
	// returned for a retry.
	LastAttempt bool
	// Attempt is the queue's number of this try: River's Job.Attempt, 1 for
	// the first run and one more for each later one (River counts neither a
	// run cut short by its shutdown nor a snoozed one). A try that writes
	// the event's row (records its error, records it as failed, or applies
	// it) sets the row's attempts to it, so that the two counts agree: a
	// try whose worker was killed is counted by the next one. Zero when the
	// queue does not count: attempts then counts the recorded failures.
	Attempt int
	// NextTry, if set, returns when the queue runs the job again after this
	// try, which failed and will be retried: the log of a failed try calls
	// it once, as the try ends (River's retry policy counts from then).
	NextTry func() time.Time
}

// ApplyQueued applies the queued event j names, exactly once, with the
// route registered for its source and type (Config.Routes), found from the
// event's row: the queue's job carries only the source and key. In one new
// transaction on the Processor's database it locks the event's row (the
// lock travels with BEGIN and waits for a concurrent apply of the same
// event to end) and then:
//   - when the event is already settled (done or failed) or gone (pruned),
//     commits nothing: OutcomeDuplicate;
//   - when it is queued, runs the route's handler on the stored payload,
//     marks the row done (the mark travels with COMMIT) and commits:
//     OutcomeProcessed;
//   - when a lease-mode claim holds it (the key was claimed through
//     ProcessLease), changes nothing: OutcomeInFlight with RetryAfter;
//   - when its route is in lease mode (InboxLease), applies it as
//     applyQueuedLease says, under a claim.
//
// An event whose source and type have no route is recorded as failed (a
// dead letter: register the route, then replay it). The handler's error
// rolls everything back. A PermanentError, or any error on j.LastAttempt,
// then records the event as failed, with its payload, for an operator to
// replay (Replay): OutcomeFailed with Result.Err. Any other error is
// recorded on the row (attempts, last error) and returned: the queue
// retries the job, and the row stays queued. A panic in the handler rolls
// back too and is recorded the same way ("handler panicked: " and its
// value: a dead letter on j.LastAttempt, the try's error otherwise) before
// it is raised again.
//
// Two errors are never the handler's failure, and are returned with the row
// left queued, on the last attempt too: the queue must run the job again.
//   - A database that could not be used or a commit of unknown outcome
//     (errors matching ErrUnavailable or ErrCommitUnknown), recorded on the
//     row when the database answers; the queue's retry finds the event
//     settled or queued. Package inbox snoozes a job in this case on its
//     last attempt rather than let River discard it.
//   - A cancellation of ctx (context.Canceled, not its deadline): the queue
//     is shutting down, and runs the job again after the restart (River
//     does so without counting the try). A try whose ctx deadline ran out
//     is the handler's failure.
//
// Every failed try is logged through Config.Logger.
//
// The transaction is retried, as Process's is, after a serialization
// failure or deadlock. ctx bounds the work up to COMMIT.
func (p *Processor) ApplyQueued(ctx context.Context, j QueuedJob) (Result, error) {
	p.crash.At(crash.InboxAfterFetch)
	var (
		row     db.LockQueuedEventRow
		settled bool
		res     Result
		lease   LeaseHandler // the route's, when it is in lease mode
		inLease bool         // applyQueuedLease runs: its claim records a panic itself
	)
	defer func() {
		if v := recover(); v != nil {
			if !inLease {
				p.queuedTryFailed(ctx, j, row.EventType, fmt.Errorf("handler panicked: %v", v))
			}
			panic(v)
		}
	}()
	err := engine.Run(ctx, engine.Begin(p.db), p.run, engine.Spec{
		First: func(ctx context.Context, q engine.Querier) error {
			settled = false // a retried transaction starts afresh
			var err error
			row, err = db.New(q).LockQueuedEvent(ctx, db.LockQueuedEventParams{Source: j.Source, EventKey: j.Key})
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				row = db.LockQueuedEventRow{}
				return nil
			case err != nil:
				return fmt.Errorf("lock queued event: %w", err)
			}
			return nil
		},
		Body: func(ctx context.Context, tx pgx.Tx) error {
			if row.Status != statusQueued && row.Status != statusInProgress {
				settled = true // done, failed, or no row
				return nil
			}
			r, ok := p.routes.lookup(j.Source, row.EventType)
			switch {
			case ok && r.isLease():
				lease = r.lease
				return errLeaseApply
			case row.Status == statusInProgress:
				res = Result{Outcome: OutcomeInFlight, RetryAfter: untilLeaseEnds(row.LeaseExpiresAt)}
				return errRollback
			case !ok:
				return Permanent(fmt.Errorf("%w %q of source %q", ErrNoHandler, row.EventType, j.Source))
			}
			ev := Event{Source: j.Source, Key: j.Key, Type: row.EventType, Payload: row.Payload, PayloadHash: row.PayloadHash}
			if err := r.handler(ctx, tx, ev); err != nil {
				if IsPermanent(err) {
					return err
				}
				return fmt.Errorf("handle event: %w", err)
			}
			p.crash.At(crash.InboxAfterHandler)
			// The done mark travels with COMMIT.
			if _, err := db.New(engine.Deferred(tx)).MarkQueuedDone(ctx, db.MarkQueuedDoneParams{
				Attempt: int32(j.Attempt), KeepPayload: p.storePayload, Source: j.Source, EventKey: j.Key,
			}); err != nil {
				return fmt.Errorf("mark event done: %w", err)
			}
			return nil
		},
		BeforeCommit: func() { p.crash.At(crash.InboxBeforeCommit) },
	})
	switch {
	case err == nil:
		p.crash.At(crash.InboxAfterCommit)
		if settled {
			return Result{Outcome: OutcomeDuplicate}, nil
		}
		return Result{Outcome: OutcomeProcessed}, nil
	case errors.Is(err, errRollback):
		return res, nil
	case errors.Is(err, errLeaseApply):
		inLease = true
		return p.applyQueuedLease(ctx, j, lease)
	}
	return p.queuedTryFailed(ctx, j, row.EventType, err)
}

// errLeaseApply stops ApplyQueued's transaction for an event whose route is
// in lease mode: it is applied under a claim instead.
var errLeaseApply = errors.New("txhook: apply under a claim")

// queuedTryFailed settles a try of j that failed with err: a database fault
// is recorded on the row (when the database answers) and returned, a
// cancellation of ctx only returned, a permanent error or any other on the
// last attempt records the event as failed, any other is recorded on the
// row and returned. Each is logged.
func (p *Processor) queuedTryFailed(ctx context.Context, j QueuedJob, eventType string, err error) (Result, error) {
	var res Result
	switch {
	case cancelled(ctx):
	case databaseFault(err) || !(IsPermanent(err) || j.LastAttempt):
		p.recordQueuedError(ctx, j, err)
	default:
		res, err = p.failQueued(ctx, j, err)
	}
	p.logQueuedTry(ctx, j, eventType, res, err)
	return res, err
}

// databaseFault reports whether err says the database could not be used or
// a commit's outcome is unknown: not a handler's failure, so a queued
// event is never recorded as failed for it, on its last attempt either.
func databaseFault(err error) bool {
	return errors.Is(err, ErrUnavailable) || errors.Is(err, ErrCommitUnknown)
}

// cancelled reports whether ctx was cancelled (not timed out): a try that
// failed then was cut short by the queue's shutdown, not failed by its
// handler.
func cancelled(ctx context.Context) bool {
	return errors.Is(ctx.Err(), context.Canceled)
}

// logQueuedTry logs a try of j that ended with res and err, when it failed:
// the event recorded as failed (a dead letter), or the try's error and
// whether and when the queue runs the job again.
func (p *Processor) logQueuedTry(ctx context.Context, j QueuedJob, eventType string, res Result, err error) {
	attrs := []slog.Attr{
		slog.String("source", j.Source), slog.String("key", j.Key), slog.String("type", eventType),
	}
	if j.Attempt > 0 {
		attrs = append(attrs, slog.Int("attempt", j.Attempt))
	}
	switch {
	case err == nil && res.Outcome == OutcomeFailed:
		attrs = append(attrs, slog.String("err", errorText(res.Err)))
		p.log.LogAttrs(ctx, slog.LevelError, "txhook: inbox event failed: recorded as a dead letter, for a replay", attrs...)
		return
	case err == nil:
		return
	}
	attrs = append(attrs, slog.String("err", errorText(err)))
	retried := true // the queue runs the job again, at j.NextTry
	level, msg := slog.LevelWarn, "txhook: inbox event try failed; its job runs again"
	switch {
	case cancelled(ctx):
		retried = false // after the restart
		level, msg = slog.LevelInfo, "txhook: inbox event try cut short by a shutdown; its job runs again after the restart"
	case databaseFault(err):
		msg = "txhook: inbox event try failed on a database fault, not the handler's; its job runs again"
	case j.LastAttempt:
		retried = false
		level, msg = slog.LevelError, "txhook: inbox event's last try failed and could not be recorded as failed; FailStuck records it once its job has ended"
	}
	if retried && j.NextTry != nil {
		attrs = append(attrs, slog.Time("next_try", j.NextTry()))
	}
	p.log.LogAttrs(ctx, level, msg, attrs...)
}

// failQueued records the queued event of j as failed after herr.
func (p *Processor) failQueued(ctx context.Context, j QueuedJob, herr error) (Result, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.run.FinishTimeout)
	defer cancel()
	var n int64
	err := p.autocommit(ctx, func(ctx context.Context, q *db.Queries) error {
		var err error
		n, err = q.MarkQueuedFailed(ctx, db.MarkQueuedFailedParams{
			Attempt: int32(j.Attempt), LastError: pgtype.Text{String: errorText(herr), Valid: true},
			Source: j.Source, EventKey: j.Key,
		})
		return err
	})
	switch {
	case err != nil:
		return Result{}, fmt.Errorf("record failed event: %w", errors.Join(err, herr))
	case n == 0:
		// Settled meanwhile by another run of the job.
		return Result{Outcome: OutcomeDuplicate}, nil
	}
	return Result{Outcome: OutcomeFailed, Err: herr}, nil
}

// recordQueuedError records herr, a failed try that the queue retries, on
// the event's row. It is best effort: the retry does not depend on it.
func (p *Processor) recordQueuedError(ctx context.Context, j QueuedJob, herr error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.run.FinishTimeout)
	defer cancel()
	_ = p.autocommit(ctx, func(ctx context.Context, q *db.Queries) error {
		_, err := q.RecordQueuedError(ctx, db.RecordQueuedErrorParams{
			Attempt: int32(j.Attempt), LastError: pgtype.Text{String: errorText(herr), Valid: true},
			Source: j.Source, EventKey: j.Key,
		})
		return err
	})
}

// applyQueuedLease is ApplyQueued for an event whose route is in lease mode:
// for events whose effects reach outside the database. It claims the queued event (or takes
// over a claim whose lease has ended, after a handler error or a dead
// worker) with a fencing token, runs h.Work while renewing the claim, and
// then, in one transaction, marks the event done conditional on the token,
// runs the TxFunc Work returned (phase two), and commits.
// Pass Claim.IdempotencyKey to every external call: a takeover runs the work
// again. The token is the event's attempts, raised to j.Attempt when that is
// higher (it still grows with every claim).
//
// Outcomes are ApplyQueued's: duplicate (settled or gone), processed, in flight (a live claim
// holds the event; retry after Result.RetryAfter), failed (Permanent, or any
// error or panic on j.LastAttempt but a database fault, a cancellation of
// ctx and a lost claim). Any other error releases the claim at once and is
// returned, for the queue to retry; a claim lost during the work returns an
// error matching ErrLeaseLost, with nothing of phase two committed. A panic
// releases the claim (or, on j.LastAttempt, records the event as failed) and
// is raised again. Every failed try is logged through Config.Logger.
func (p *Processor) applyQueuedLease(ctx context.Context, j QueuedJob, h LeaseHandler) (res Result, err error) {
	s, err := h.settings()
	if err != nil {
		return Result{}, err
	}
	started := time.Now()
	var row db.ClaimQueuedEventRow
	defer func() {
		if v := recover(); v != nil {
			err := fmt.Errorf("handler panicked: %v", v)
			if j.LastAttempt && !cancelled(ctx) {
				p.logQueuedTry(ctx, j, row.EventType, Result{Outcome: OutcomeFailed, Err: err}, nil)
			} else {
				p.logQueuedTry(ctx, j, row.EventType, Result{}, err)
			}
			panic(v)
		}
		p.logQueuedTry(ctx, j, row.EventType, res, err)
	}()
	err = p.autocommit(ctx, func(ctx context.Context, q *db.Queries) error {
		var err error
		row, err = q.ClaimQueuedEvent(ctx, db.ClaimQueuedEventParams{
			Attempt: int32(j.Attempt), LeaseMs: durationMs(s.lease), Source: j.Source, EventKey: j.Key,
		})
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return p.settledOrHeld(ctx, j)
	}
	if err != nil {
		return Result{}, fmt.Errorf("claim queued event: %w", err)
	}
	c := Claim{Source: j.Source, Key: j.Key, Token: int(row.Attempts), claimedAt: row.ClaimedAt}
	ev := Event{Source: j.Source, Key: j.Key, Type: row.EventType, Payload: row.Payload, PayloadHash: row.PayloadHash}
	return p.runClaim(ctx, c, ev, s, started, false, h.Work, onLastAttempt(ctx, j.LastAttempt))
}

// settledOrHeld answers a lease-mode job whose event could not be claimed:
// settled or gone, or held by a live claim (in flight).
func (p *Processor) settledOrHeld(ctx context.Context, j QueuedJob) (Result, error) {
	var res Result
	err := engine.Run(ctx, engine.Begin(p.db), p.run, engine.Spec{
		First: func(ctx context.Context, q engine.Querier) error {
			row, err := db.New(q).LockQueuedEvent(ctx, db.LockQueuedEventParams{Source: j.Source, EventKey: j.Key})
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				res = Result{Outcome: OutcomeDuplicate}
			case err != nil:
				return fmt.Errorf("lock queued event: %w", err)
			case row.Status == statusInProgress || row.Status == statusQueued:
				// Held by a live claim, or released and queued again meanwhile:
				// the queue tries again later.
				res = Result{Outcome: OutcomeInFlight, RetryAfter: untilLeaseEnds(row.LeaseExpiresAt)}
				return errRollback
			default:
				res = Result{Outcome: OutcomeDuplicate}
			}
			return nil
		},
		Body: func(context.Context, pgx.Tx) error { return nil },
	})
	if err != nil && !errors.Is(err, errRollback) {
		return Result{}, err
	}
	return res, nil
}

// FailStuck records as failed the stuck inbox events of sources (of the
// sources of the Processor's inbox routes when sources is empty): those queued, or in progress with their
// lease ended, whose queue job is gone (deleted), completed, discarded or
// cancelled, and which no job will therefore apply. Their jobs are River's,
// looked up in riverSchema's river_job ("" for the one the search path
// finds; without that table nothing is stuck). River gives a job up on its
// last attempt when its worker was killed, and an operator may discard,
// cancel or delete one; an event left so would otherwise stay queued for
// ever. Each becomes a dead letter with its payload, for a replay
// (Replay), its last error naming its job, what became of the job and
// the last error of either; each is logged through Config.Logger. It
// returns the events it recorded (source, key, type, status, last error and
// job). Package inbox runs it every minute on the River client's leader.
//
// An event whose job is live (available, scheduled, retryable, running or
// pending) is never touched, nor one a concurrent apply holds: it is
// locked, and checked again, before it is changed. The search goes through
// the partial indexes of queued and in-progress rows and the job table's
// primary key.
func (p *Processor) FailStuck(ctx context.Context, riverSchema string, sources []string) ([]EventRecord, error) {
	if len(sources) == 0 {
		if sources = p.routes.inboxSources(); len(sources) == 0 {
			return nil, nil // no inbox route: nothing of this processor's is queued
		}
	}
	var rows []db.FailStuckEventsRow
	err := p.autocommit(ctx, func(ctx context.Context, q *db.Queries) error {
		var err error
		rows, err = q.FailStuckEvents(ctx, db.FailStuckEventsParams{Sources: sources, RiverSchema: optText(riverSchema)})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("fail stuck events: %w", err)
	}
	out := make([]EventRecord, len(rows))
	for i, r := range rows {
		out[i] = EventRecord{Source: r.Source, Key: r.EventKey, Type: r.EventType, Status: StatusFailed,
			LastError: r.LastError.String, JobID: r.JobID.Int64}
		p.log.LogAttrs(ctx, slog.LevelError, "txhook: stuck inbox event recorded as a dead letter, for a replay",
			slog.String("source", r.Source), slog.String("key", r.EventKey), slog.String("type", r.EventType),
			slog.Int64("job_id", r.JobID.Int64), slog.String("err", r.LastError.String))
	}
	return out, nil
}

// QueueStats describes inbox mode's queue: the events accepted and not yet
// applied.
type QueueStats struct {
	// Queued is the number of events with status queued.
	Queued int64 `json:"queued"`
	// OldestAt is when the oldest of them was accepted; zero when none is
	// queued. OldestAge is how long ago that was, on the database's clock.
	OldestAt  time.Time     `json:"oldest_at,omitzero"`
	OldestAge time.Duration `json:"oldest_age,omitzero"`
}

// ReadQueueStats reads inbox mode's queue depth and the age of its oldest
// event, through an index that holds only queued rows: cheap enough for a
// metrics callback.
func ReadQueueStats(ctx context.Context, q Querier) (QueueStats, error) {
	r, err := db.New(q).QueueStats(ctx)
	if err != nil {
		return QueueStats{}, fmt.Errorf("read queue stats: %w", err)
	}
	qs := QueueStats{Queued: r.Queued}
	if r.Oldest.Valid {
		qs.OldestAt = r.Oldest.Time
		qs.OldestAge = time.Duration(r.OldestAgeMs) * time.Millisecond
	}
	return qs, nil
}

// readQueue adds the inbox's queue depth and oldest queued event to s.
func (s *Stats) readQueue(ctx context.Context, q Querier) error {
	qs, err := ReadQueueStats(ctx, q)
	if err != nil {
		return err
	}
	s.Queue = qs
	return nil
}
