package txhook

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/txhook/txhook/db"
	"github.com/txhook/txhook/internal/engine"
)

// Inbox mode keeps the retry on the receiving side, for senders that never
// retry (GitHub) or give up fast (Shopify), and for handlers slower than the
// sender's timeout. A delivery is accepted: its event row is stored with
// status queued, payload and payload hash, together with a job in the
// application's queue, and the sender is answered 2xx only after that
// COMMIT. The queue's worker then applies the event: in one transaction it
// locks the row, runs the handler and marks the row done (and, when the
// queue asks, completes its job: QueuedJob.Complete).
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

// EnqueueFunc inserts the job that will apply an accepted event, in tx, the
// transaction that records the event as queued (River's InsertTx), and
// returns the job's id, which is recorded with the event. It runs before the
// event's key is known to be new: a duplicate rolls its job back.
type EnqueueFunc func(ctx context.Context, tx pgx.Tx, ev Event) (jobID int64, err error)

// Accept records ev as queued and enqueues its job, in one new transaction
// on the Processor's database, in two round trips: a check that the key is
// not recorded yet and enqueue's first statement travel with BEGIN; the
// row's insert, with the job's id, travels with COMMIT, so the row is
// written once. The payload and payload hash are stored whatever
// Config.StorePayload says: the job reads the payload from the row (its
// arguments name only the source and key).
//
// A nil error comes with one of the outcomes:
//   - queued: the key was new; the row and the job are committed, and the
//     sender may be acknowledged;
//   - duplicate: the key exists, queued, in progress, done or failed; the
//     check answered so in the first round trip, before the server ran
//     enqueue's statement (a redelivery inserts no job and writes
//     nothing), or, for a key recorded by a concurrent delivery meanwhile,
//     the row's insert did with COMMIT's round trip; nothing was
//     committed, and a job enqueue inserted rolled back with the rest;
//   - in flight: a concurrent delivery of the same key holds it, past
//     Config.LockTimeout; nothing was committed. Never acknowledge it.
//
// Since enqueue runs before the key is known new, it must write only
// through tx (River's InsertTx does).
//
// With a ReplayGuard, its check runs next, after the key's; its lock is
// held until COMMIT, with which the row is inserted, so the next delivery
// of the same body finds the row. A concurrent delivery of the same key
// then waits at the guard's lock (bounded by ReplayGuard.LockTimeout, past
// which it fails with ErrReplayInFlight) before it is answered a duplicate.
// Any error means nothing was committed (a *CommitUnknownError: the outcome
// cannot be known), and the sender must not be acknowledged; a database
// that cannot be used gives an *UnavailableError. ctx bounds the work up to
// COMMIT.
func (p *Processor) Accept(ctx context.Context, ev Event, g *ReplayGuard, enqueue EnqueueFunc) (Result, error) {
	return p.accept(ctx, engine.Begin(p.db), ev, g, enqueue)
}

// AcceptTx is Accept inside tx, a transaction the caller owns, under a
// savepoint: the row and the job commit when the caller commits tx, and a
// duplicate or an error rolls back only Accept's own work. The caller must
// not acknowledge the event before tx commits.
func (p *Processor) AcceptTx(ctx context.Context, tx pgx.Tx, ev Event, g *ReplayGuard, enqueue EnqueueFunc) (Result, error) {
	return p.accept(ctx, engine.Savepoint(tx), ev, g, enqueue)
}

func (p *Processor) accept(ctx context.Context, at engine.Target, ev Event, g *ReplayGuard, enqueue EnqueueFunc) (Result, error) {
	if enqueue == nil {
		return Result{}, errors.New("txhook: accept: nil enqueue")
	}
	if err := ev.validate(p.maxKeyLen); err != nil {
		return Result{}, err
	}
	o := p.run
	if g != nil && !at.Nested() {
		o.Tx.IsoLevel = pgx.ReadCommitted // the guard's lookup must see what committed while it waited
	}
	err := engine.Run(ctx, at, o, engine.Spec{
		Body: func(ctx context.Context, tx pgx.Tx) error {
			q := db.New(engine.Deferred(tx))
			// A recorded key fails this check, which travels with BEGIN
			// ahead of the next statement (the guard's, or the job's
			// insert): the server skips what follows it in that round
			// trip, so a redelivery inserts no job and writes nothing.
			if err := q.CheckKeyNotRecorded(ctx, db.CheckKeyNotRecordedParams{Source: ev.Source, EventKey: ev.Key}); err != nil {
				return err
			}
			if g != nil {
				// The guard's lock is held until COMMIT, which the row
				// travels with: the next delivery of the body sees the row.
				if err := g.check(ctx, tx, ev); err != nil {
					return err
				}
			}
			id, err := enqueue(ctx, tx, ev)
			if err != nil {
				return fmt.Errorf("enqueue event: %w", err)
			}
			return q.QueueEventWithJob(ctx, db.QueueEventWithJobParams{
				Source: ev.Source, EventKey: ev.Key, EventType: ev.Type, Payload: ev.Payload,
				PayloadHash: ev.PayloadHash, JobID: id, LockTimeout: p.lockTimeout,
			})
		},
	})
	if err == nil {
		return Result{Outcome: OutcomeQueued}, nil
	}
	if de, ok := errors.AsType[*engine.DeferredError](err); ok {
		// The key's check, sent with BEGIN, or the row's insert, sent with
		// COMMIT, answered: nothing committed.
		switch pgErr, _ := errors.AsType[*pgconn.PgError](de); {
		case pgErr != nil && pgErr.Code == sqlstateKeyExists:
			return Result{Outcome: OutcomeDuplicate}, nil
		case isLockTimeout(de):
			return Result{Outcome: OutcomeInFlight, RetryAfter: p.inFlightWait}, nil
		}
	}
	return Result{}, apiError(err)
}

// sqlstateKeyExists is the SQLSTATE with which txhook_queue_event_with_job
// answers a key that is already recorded.
const sqlstateKeyExists = "P0T01"

// QueuedJob is the queue job that applies one accepted event.
type QueuedJob struct {
	// Source and Key name the event.
	Source, Key string
	// LastAttempt reports that the queue will not run the job again: a
	// handler error then records the event as failed instead of being
	// returned for a retry.
	LastAttempt bool
	// Complete, if set, runs in the transaction that settles the event,
	// after the handler: the queue's own completion of the job (River's
	// JobCompleteTx, for one), so that the event and its job settle
	// together or not at all. It is not run when the event is recorded as
	// failed: the queue then ends the job itself. Without it the queue
	// completes the job after the worker returns, and a job run again
	// finds its event settled: package inbox leaves it unset, since
	// River's completer records completions in batches for much less.
	Complete func(ctx context.Context, tx pgx.Tx) error
}

// ApplyQueued applies the queued event j names with h, exactly once. In one
// new transaction on the Processor's database it locks the event's row (the
// lock travels with BEGIN and waits for a concurrent apply of the same
// event to end) and then:
//   - when the event is already settled (done or failed) or gone (pruned),
//     runs only j.Complete and commits: OutcomeDuplicate;
//   - when it is queued, runs h on the stored payload, runs j.Complete,
//     marks the row done (the mark travels with COMMIT) and commits:
//     OutcomeProcessed;
//   - when a lease-mode claim holds it (the key was claimed through
//     ProcessLease), changes nothing: OutcomeInFlight with RetryAfter.
//
// h's error rolls everything back. A PermanentError, or any error of h's on
// j.LastAttempt, then records the event as failed, with its payload, for an
// operator to replay (Replayer): OutcomeFailed with Result.Err, j.Complete
// not run. Any other error is recorded on the row (attempts, last error) and
// returned: the queue retries the job, and the row stays queued. An error
// that says the database could not be used (*UnavailableError), or a commit
// of unknown outcome, is not h's failure: it is returned, and the row stays
// queued, on the last attempt too.
//
// The transaction is retried, as Process's is, after a serialization
// failure or deadlock. A *CommitUnknownError means the outcome cannot be
// known: the queue's retry finds the event settled or queued. ctx bounds
// the work up to COMMIT.
func (p *Processor) ApplyQueued(ctx context.Context, j QueuedJob, h HandlerFunc) (Result, error) {
	if h == nil {
		return Result{}, errors.New("txhook: apply queued event: nil handler")
	}
	p.crash.at(CrashInboxAfterFetch)
	var (
		row     db.LockQueuedEventRow
		settled bool
		failed  bool // h returned an error
		res     Result
	)
	err := engine.Run(ctx, engine.Begin(p.db), p.run, engine.Spec{
		First: func(ctx context.Context, q engine.Querier) error {
			settled, failed = false, false // a retried transaction starts afresh
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
			switch row.Status {
			case statusQueued:
			case statusInProgress:
				res = Result{Outcome: OutcomeInFlight, RetryAfter: untilLeaseEnds(row.LeaseExpiresAt)}
				return errRollback
			default: // done, failed, or no row
				settled = true
				return j.complete(ctx, tx)
			}
			ev := Event{Source: j.Source, Key: j.Key, Type: row.EventType, Payload: row.Payload, PayloadHash: row.PayloadHash}
			if err := h(ctx, tx, ev); err != nil {
				failed = true
				if IsPermanent(err) {
					return err
				}
				return fmt.Errorf("handle event: %w", err)
			}
			p.crash.at(CrashInboxAfterHandler)
			if err := j.complete(ctx, tx); err != nil {
				return err
			}
			// The done mark travels with COMMIT (a job completion, a
			// query, could not carry it).
			if _, err := db.New(engine.Deferred(tx)).MarkQueuedDone(ctx, db.MarkQueuedDoneParams{
				KeepPayload: p.storePayload, Source: j.Source, EventKey: j.Key,
			}); err != nil {
				return fmt.Errorf("mark event done: %w", err)
			}
			return nil
		},
		BeforeCommit: func() { p.crash.at(CrashInboxBeforeCommit) },
	})
	switch {
	case err == nil:
		p.crash.at(CrashInboxAfterCommit)
		if settled {
			return Result{Outcome: OutcomeDuplicate}, nil
		}
		return Result{Outcome: OutcomeProcessed}, nil
	case errors.Is(err, errRollback):
		return res, nil
	}
	err = apiError(err)
	if !failed || databaseFault(err) {
		// Not the handler's failure: the queue's retry applies the event.
		return Result{}, err
	}
	if IsPermanent(err) || j.LastAttempt {
		return p.failQueued(ctx, j, err)
	}
	p.recordQueuedError(ctx, j, err)
	return Result{}, err
}

// databaseFault reports whether err says the database could not be used or
// a commit's outcome is unknown: not a handler's failure, so a queued
// event is never recorded as failed for it, on its last attempt either.
func databaseFault(err error) bool {
	return errors.Is(err, ErrUnavailable) || errors.Is(err, ErrCommitUnknown)
}

func (j QueuedJob) complete(ctx context.Context, tx pgx.Tx) error {
	if j.Complete == nil {
		return nil
	}
	if err := j.Complete(ctx, tx); err != nil {
		return fmt.Errorf("complete job: %w", err)
	}
	return nil
}

// failQueued records the queued event of j as failed after herr.
func (p *Processor) failQueued(ctx context.Context, j QueuedJob, herr error) (Result, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.run.FinishTimeout)
	defer cancel()
	var n int64
	err := p.autocommit(ctx, func(ctx context.Context, q *db.Queries) error {
		var err error
		n, err = q.MarkQueuedFailed(ctx, db.MarkQueuedFailedParams{
			LastError: pgtype.Text{String: errorText(herr), Valid: true}, Source: j.Source, EventKey: j.Key,
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
			LastError: pgtype.Text{String: errorText(herr), Valid: true}, Source: j.Source, EventKey: j.Key,
		})
		return err
	})
}

// ApplyQueuedLease is ApplyQueued for a lease-mode handler: for events whose
// effects reach outside the database. It claims the queued event (or takes
// over a claim whose lease has ended, after a handler error or a dead
// worker) with a fencing token, runs h.Work while renewing the claim, and
// then, in one transaction, marks the event done conditional on the token,
// runs the TxFunc Work returned (phase two) and j.Complete, and commits.
// Pass Claim.IdempotencyKey to every external call: a takeover runs the work
// again.
//
// Outcomes are ApplyQueued's: duplicate (settled or gone: only j.Complete
// ran, in a transaction of its own), processed, in flight (a live claim
// holds the event; retry after Result.RetryAfter), failed (Permanent, or any
// error on j.LastAttempt but those that say the database could not be used
// or a commit's outcome is unknown, and a lost claim). Any other error
// releases the claim at once and is returned, for the queue to retry; a
// claim lost during the work returns an error matching ErrLeaseLost, with
// nothing of phase two committed.
func (p *Processor) ApplyQueuedLease(ctx context.Context, j QueuedJob, h LeaseHandler) (Result, error) {
	s, err := h.settings()
	if err != nil {
		return Result{}, err
	}
	p.crash.at(CrashInboxAfterFetch)
	started := time.Now()
	var row db.ClaimQueuedEventRow
	err = p.autocommit(ctx, func(ctx context.Context, q *db.Queries) error {
		var err error
		row, err = q.ClaimQueuedEvent(ctx, db.ClaimQueuedEventParams{
			LeaseMs: durationMs(s.lease), Source: j.Source, EventKey: j.Key,
		})
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return p.settledOrHeld(ctx, j)
	}
	if err != nil {
		return Result{}, directError(fmt.Errorf("claim queued event: %w", err))
	}
	c := Claim{Source: j.Source, Key: j.Key, Token: int(row.Attempts), claimedAt: row.ClaimedAt}
	ev := Event{Source: j.Source, Key: j.Key, Type: row.EventType, Payload: row.Payload, PayloadHash: row.PayloadHash}
	lastAttempt := func(err error) error {
		if j.LastAttempt && !IsPermanent(err) && !errors.Is(err, ErrLeaseLost) && !databaseFault(err) {
			return Permanent(err)
		}
		return err
	}
	return p.runClaim(ctx, c, ev, s, started, false, h.Work, j.complete, lastAttempt)
}

// settledOrHeld answers a lease-mode job whose event could not be claimed:
// settled or gone (the job is completed, in a transaction of its own), or
// held by a live claim (in flight).
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
		Body: func(ctx context.Context, tx pgx.Tx) error { return j.complete(ctx, tx) },
	})
	if err != nil && !errors.Is(err, errRollback) {
		return Result{}, apiError(err)
	}
	return res, nil
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
	s.Queued, s.OldestQueuedAt, s.OldestQueuedAge = qs.Queued, qs.OldestAt, qs.OldestAge
	return nil
}
