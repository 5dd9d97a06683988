package txhook

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/txhook/txhook/db"
	"github.com/txhook/txhook/internal/crash"
	"github.com/txhook/txhook/internal/engine"
)

// Outcome is what became of a delivered event.
type Outcome int

// Outcomes of Process. The zero Outcome is never returned with a nil error.
const (
	// OutcomeProcessed: the handler ran and its writes committed together
	// with the event's key.
	OutcomeProcessed Outcome = iota + 1
	// OutcomeDuplicate: the event's key was already committed (processed, or
	// recorded as failed); nothing ran.
	OutcomeDuplicate
	// OutcomeInFlight: another delivery of the same key holds it and has not
	// finished; nothing ran. Ask the sender to retry after Result.RetryAfter;
	// never acknowledge this outcome as success.
	OutcomeInFlight
	// OutcomeFailed: the handler returned a PermanentError; its writes were
	// rolled back and the event was recorded as failed for an operator to
	// replay. The sender may be told to stop retrying.
	OutcomeFailed
)

// String returns the outcome's lowercase name.
func (o Outcome) String() string {
	switch o {
	case OutcomeProcessed:
		return "processed"
	case OutcomeDuplicate:
		return "duplicate"
	case OutcomeInFlight:
		return "in_flight"
	case OutcomeFailed:
		return "failed"
	case OutcomeQueued:
		return "queued"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Result describes a finished call to Process.
type Result struct {
	Outcome Outcome
	// RetryAfter is set for OutcomeInFlight: a hint for how long the sender
	// should wait before delivering again.
	RetryAfter time.Duration
	// Err is the handler's permanent error, for OutcomeFailed.
	Err error
}

// HandlerFunc applies one event. Every write must go through tx, which is
// the same transaction that records the event's key: the writes and the key
// commit together or not at all. Wrap tx with the application's own
// sqlc-generated queries (mydb.New(tx)), or use WithQueries.
//
// A returned error rolls everything back and is returned by Process; the
// event stays unprocessed and the sender's retry runs the handler again. A
// handler may run more than once per delivery when the transaction is
// retried after a serialization failure or deadlock, so it must not have
// effects outside tx (use lease mode for those). txhook commits or rolls
// back tx: its Commit and Rollback return an error (savepoints the handler
// begins with tx.Begin are the handler's to end), and a ROLLBACK or COMMIT
// it sends as SQL fails the delivery: the statements after it are refused
// (each would commit on its own), and it is never answered processed.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, ev Event) error

// Config configures a Processor. The zero value (or nil) gives the defaults.
type Config struct {
	// LockTimeout bounds how long a delivery waits for a concurrent delivery
	// of the same key to commit or roll back before it is answered
	// OutcomeInFlight. It bounds only the dedupe step, not the handler's own
	// statements. Defaults to 2s: short enough for providers that give up
	// after 5s (Shopify).
	LockTimeout time.Duration
	// InFlightRetryAfter is Result.RetryAfter when the lock wait bound is
	// hit. Defaults to 5s.
	InFlightRetryAfter time.Duration
	// MaxKeyLen is the longest accepted event key in bytes. Defaults to
	// DefaultMaxKeyLen (255).
	MaxKeyLen int
	// StorePayload keeps each event's payload in the events table. The
	// payload of an event recorded as failed is stored whatever this says,
	// so that the dead letter can be replayed. Defaults to false.
	StorePayload bool
	// Tx configures the transactions (isolation level, retries). Defaults to
	// the zero TxOptions.
	Tx *TxOptions
	// DedupeWithFirstStatement makes Process and ProcessTx send the dedupe
	// step in the same round trip as the handler's first statement, instead
	// of one round trip before the handler runs: a new event costs one
	// round trip fewer. The handler then starts before its key is known to
	// be new. When the key is already committed or held by another
	// delivery, the dedupe step fails and the server skips the statements
	// sent with it: that statement and every later one return ErrNotNew,
	// nothing of the handler runs in the database, and the outcome is
	// duplicate or in flight whatever the handler returns. For a new key
	// they run under the session's own lock_timeout, which the dedupe step
	// restores as it records the key (a handler whose first statement sets
	// lock_timeout itself keeps its own setting). A handler whose writes
	// are all deferred (Deferred) then costs one round trip in all on a
	// pool or a connection: BEGIN, the dedupe step, its writes and COMMIT
	// travel together (the crash point after-insert is then reached once
	// that round trip has answered, COMMIT included). Use it
	// for handlers that do nothing but decode, check and write through tx
	// (what a transactional handler should do): code before their first
	// statement runs for every delivery. A handler's first
	// QueryRow is sent when its row is scanned, and a first Query,
	// SendBatch, CopyFrom or Prepare after the dedupe step. Lease mode is
	// unchanged.
	DedupeWithFirstStatement bool
	// RecentKeys is how many event keys a Processor remembers after the
	// database answered them done (processed by this Processor, or read as
	// done), so that Process answers a redelivery of one as a duplicate
	// without a round trip. A done key stays done while its row exists, and
	// rows are pruned only after the events table's retention, far past
	// RecentKeysTTL, so the memory answers as the database would; the
	// exception is a row deleted by hand to have its event processed again,
	// which a Processor that remembers the key sees only once RecentKeysTTL
	// has passed, or once told to forget (Processor.ForgetRecentKeys).
	// Keys recorded as failed are not remembered (an operator may replay
	// them), and lease mode never asks the memory. Defaults to
	// DefaultRecentKeys (10,000 keys, about 2 MB); a negative value turns
	// the memory off.
	RecentKeys int
	// RecentKeysTTL is how long a done key is remembered. Defaults to
	// DefaultRecentKeysTTL (10 minutes).
	RecentKeysTTL time.Duration
	// Routes are the application's handlers, by source and event type:
	// Deliver, and everything built on the Processor (the HTTP endpoint,
	// the inbox's jobs, the queue consumers, Replay), find their
	// handler there. Defaults to none: Process and ProcessLease, which take
	// their handler as an argument, still work.
	Routes *Routes
	// Logger receives a record for every failed try of an inbox event
	// (ApplyQueued: the event, the try's number, the error
	// and what follows, the next try or the dead letter) and for every stuck
	// event recorded as failed (FailStuck). Defaults to slog.Default().
	Logger *slog.Logger
}

// Processor applies events exactly once. It is safe for concurrent use, and
// any number of processes may share one database: the unique key in the
// events table arbitrates between them.
//
// Round trips, on a pool or a connection: BEGIN and the dedupe step travel
// together; then come the handler's statements; the handler's deferred
// writes (Deferred) travel with its next statement or with COMMIT. A new
// event whose handler makes one write costs three round trips, two with
// Config.DedupeWithFirstStatement, and one when that write is deferred; a
// duplicate three (the dedupe step, ROLLBACK, and the read of a lease-mode
// claim that would make it in flight). ProcessTx does the same under a
// savepoint of the caller's transaction; any other Beginner adds its own
// BEGIN. While more than half of the recent deliveries were duplicates, as
// in a provider's redelivery storm, Process first reads the key's status
// outside any transaction: a duplicate then costs one round trip, and a new
// event one more than usual.
// A key the Processor saw done recently is answered from memory, with no
// round trip (Config.RecentKeys).
type Processor struct {
	db              Beginner
	run             engine.Options
	lockTimeout     string
	inFlightWait    time.Duration
	maxKeyLen       int
	storePayload    bool
	dedupeWithFirst bool // Config.DedupeWithFirstStatement
	crash           crash.Crasher
	filter          dupFilter
	routes          *Routes
	queue           atomic.Pointer[Queue] // inbox routes' queue (UseQueue); nil without one
	log             *slog.Logger
}

// NewProcessor returns a Processor that runs transactions on db, usually a
// *pgxpool.Pool. The database must have txhook's migrations applied (see the
// migrations package).
func NewProcessor(db Beginner, cfg *Config) (*Processor, error) {
	if db == nil {
		return nil, errors.New("txhook: new processor: nil database")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.LockTimeout < 0 || c.InFlightRetryAfter < 0 || c.MaxKeyLen < 0 || c.RecentKeysTTL < 0 {
		return nil, errors.New("txhook: new processor: negative limit in config")
	}
	if c.LockTimeout == 0 {
		c.LockTimeout = 2 * time.Second
	}
	if c.InFlightRetryAfter == 0 {
		c.InFlightRetryAfter = 5 * time.Second
	}
	if c.MaxKeyLen == 0 {
		c.MaxKeyLen = DefaultMaxKeyLen
	}
	if c.RecentKeys == 0 {
		c.RecentKeys = DefaultRecentKeys
	}
	if c.RecentKeysTTL == 0 {
		c.RecentKeysTTL = DefaultRecentKeysTTL
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	read, _ := db.(engine.Querier) // the filter's read; off on a database that only begins transactions
	return &Processor{
		db:              db,
		run:             c.Tx.engine(),
		lockTimeout:     fmt.Sprintf("%dms", max(c.LockTimeout.Milliseconds(), 1)),
		inFlightWait:    c.InFlightRetryAfter,
		maxKeyLen:       c.MaxKeyLen,
		storePayload:    c.StorePayload,
		dedupeWithFirst: c.DedupeWithFirstStatement,
		crash:           crash.FromEnv(),
		filter:          dupFilter{read: read, memory: newRecentKeys(c.RecentKeys, c.RecentKeysTTL)},
		routes:          c.Routes,
		log:             c.Logger,
	}, nil
}

// Process applies ev exactly once: in one transaction it records ev's key
// and runs h; both commit or neither does.
//
// A nil error comes with one of the outcomes: processed (h ran and
// committed), duplicate (the key was already committed; h did not run, or
// under Config.DedupeWithFirstStatement its work was rolled back), in
// flight (another delivery holds the key; likewise) or failed (h returned a
// PermanentError, recorded). Any error means nothing was committed, except a
// *CommitUnknownError, which means the outcome cannot be known; in both
// cases the event must not be acknowledged, so that the sender retries. A
// database that cannot be used gives an *UnavailableError (ErrUnavailable).
// Invalid input returns a *ValidationError (ErrInvalidEvent) and writes
// nothing.
//
// ctx bounds the work up to COMMIT: none of h's deferred writes is sent
// once it has ended; see Run.
func (p *Processor) Process(ctx context.Context, ev Event, h HandlerFunc) (Result, error) {
	return p.process(ctx, ev, h, false)
}

// process is Process; lastAttempt records a handler's error as failed (see
// DeliverOptions.LastAttempt).
func (p *Processor) process(ctx context.Context, ev Event, h HandlerFunc, lastAttempt bool) (Result, error) {
	if err := p.check(ev, h); err != nil {
		return Result{}, err
	}
	if res, ok, err := p.filter.answer(ctx, ev); ok {
		return res, err
	}
	res, err := p.apply(ctx, engine.Begin(p.db), ev, h, lastAttempt)
	p.filter.learn(ev, res, err)
	return res, err
}

// ProcessTx is Process inside tx, a transaction the caller owns: the key and
// h's writes commit when the caller commits tx. It runs under a savepoint, so
// a duplicate, an in-flight key or an error from h rolls back only its own
// work and leaves tx usable. It does not retry, and it does not ask
// Process's duplicate filter; everything else, deferred writes included, is
// as in Process. The caller must not acknowledge the event before tx
// commits. An error that matches ErrTxUnusable means tx cannot be used any
// more (its savepoint could not be rolled back, or h ended tx with a
// ROLLBACK or COMMIT sent as SQL): roll it back.
func (p *Processor) ProcessTx(ctx context.Context, tx pgx.Tx, ev Event, h HandlerFunc) (Result, error) {
	if err := p.check(ev, h); err != nil {
		return Result{}, err
	}
	return p.apply(ctx, engine.Savepoint(tx), ev, h, false)
}

func (p *Processor) check(ev Event, h HandlerFunc) error {
	if h == nil {
		return errors.New("txhook: process: nil handler")
	}
	return ev.validate(p.maxKeyLen)
}

// apply runs the dedupe step and, for a new key, h, in one transaction at
// at, and turns what happened into Process's answer. On lastAttempt, h's
// error is recorded as failed as a permanent one is.
func (p *Processor) apply(ctx context.Context, at engine.Target, ev Event, h HandlerFunc, lastAttempt bool) (Result, error) {
	var notNew Result // the dedupe step's answer for a key that is not new
	var recorded bool // the dedupe step found the key recorded
	var herr error    // h's error, wrapped, in the last attempt
	spec := engine.Spec{
		First: func(ctx context.Context, q engine.Querier) error {
			var err error
			notNew, recorded, err = p.dedupe(ctx, q, ev)
			return err
		},
		WithFirstStatement: p.dedupeWithFirst,
		FirstAborts:        true, // InsertEvent fails for a recorded key
		Body: func(ctx context.Context, tx pgx.Tx) error {
			herr = p.handled(h(ctx, tx, ev))
			return herr
		},
	}
	if !at.Nested() {
		spec.BeforeCommit = func() { p.crash.At(crash.BeforeCommit) }
	}
	err := engine.Run(ctx, at, p.run, spec)
	switch {
	case err == nil:
		if !at.Nested() {
			p.crash.At(crash.AfterCommit)
		}
		return Result{Outcome: OutcomeProcessed}, nil
	case errors.Is(err, errRollback) && recorded:
		return p.recordedKey(ctx, at, ev)
	case errors.Is(err, errRollback):
		return notNew, nil
	case IsPermanent(err):
		return p.recordFailed(ctx, at, ev, err)
	}
	if herr != nil && errors.Is(err, herr) {
		if last := onLastAttempt(ctx, lastAttempt); last != nil && IsPermanent(last(err)) {
			return p.recordFailed(ctx, at, ev, err)
		}
	}
	return Result{}, err
}

// dedupe is the dedupe step: it records ev's key in the transaction q runs
// in, its wait for a concurrent delivery of the key bounded by LockTimeout
// (the statement sets the bound and, for a new key, restores the session's
// setting: see queries/events.sql). A nil error means the key is
// new and the transaction owns it. Otherwise the run stops with
// errRollback: for a key found recorded (recorded; recordedKey then
// answers), or held by a delivery still running (in flight).
func (p *Processor) dedupe(ctx context.Context, q engine.Querier, ev Event) (notNew Result, recorded bool, err error) {
	err = db.New(q).InsertEvent(ctx, db.InsertEventParams{
		Source:      ev.Source,
		EventKey:    ev.Key,
		EventType:   ev.Type,
		Payload:     p.payload(ev),
		PayloadHash: ev.PayloadHash,
		LockTimeout: p.lockTimeout,
	})
	switch {
	case isKeyRecorded(err):
		return Result{}, true, errRollback
	case isLockTimeout(err):
		return Result{Outcome: OutcomeInFlight, RetryAfter: p.inFlightWait}, false, errRollback
	case err != nil:
		return Result{}, false, fmt.Errorf("insert event key: %w", err)
	}
	p.crash.At(crash.AfterInsert)
	return Result{}, false, nil
}

// recordedKey answers a delivery whose key the dedupe step found recorded,
// once its transaction rolled back: in flight while a lease-mode claim
// holds the key, a duplicate otherwise (done, failed, queued). The claim is
// read in a statement of its own, at the run's target: the insert's
// snapshot, taken before it waited for a concurrent delivery of the key,
// cannot see the row that delivery committed.
func (p *Processor) recordedKey(ctx context.Context, at engine.Target, ev Event) (Result, error) {
	var lease pgtype.Timestamptz
	err := engine.Statement(ctx, at, p.run, func(ctx context.Context, q engine.Querier) error {
		var err error
		lease, err = db.New(q).InFlightLease(ctx, db.InFlightLeaseParams{Source: ev.Source, EventKey: ev.Key})
		return err
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Result{Outcome: OutcomeDuplicate}, nil
	case err != nil:
		return Result{}, fmt.Errorf("read the recorded key's claim: %w", err)
	}
	return Result{Outcome: OutcomeInFlight, RetryAfter: untilLeaseEnds(lease)}, nil
}

// handled turns the handler's return for a new key into the attempt's
// error: a permanent error as it is (it is recorded as failed), any other
// wrapped (it rolls back), nil as nil (it commits).
func (p *Processor) handled(herr error) error {
	if herr != nil {
		if IsPermanent(herr) {
			return herr
		}
		return fmt.Errorf("handle event: %w", herr)
	}
	p.crash.At(crash.AfterHandler)
	return nil
}

// recordFailed records ev as failed after the handler's permanent error
// perr, at the same place its transaction ran: a new transaction, or a
// savepoint of the caller's.
func (p *Processor) recordFailed(ctx context.Context, at engine.Target, ev Event, perr error) (Result, error) {
	var n int64
	err := engine.Run(ctx, at, p.run, engine.Spec{Body: func(ctx context.Context, tx pgx.Tx) error {
		var err error
		n, err = db.New(tx).InsertFailedEvent(ctx, p.failedParams(ev, perr))
		return err
	}})
	if err != nil {
		return Result{}, fmt.Errorf("record failed event: %w", errors.Join(err, perr))
	}
	if n == 0 {
		// Another delivery committed the key in the meantime.
		return Result{Outcome: OutcomeDuplicate}, nil
	}
	return Result{Outcome: OutcomeFailed, Err: perr}, nil
}

// failedParams are the row of a failed event. Its payload is stored whatever
// Config.StorePayload says, so that the dead letter can be replayed.
func (p *Processor) failedParams(ev Event, perr error) db.InsertFailedEventParams {
	return db.InsertFailedEventParams{
		Source:      ev.Source,
		EventKey:    ev.Key,
		EventType:   ev.Type,
		LastError:   pgtype.Text{String: errorText(perr), Valid: true},
		Payload:     ev.Payload,
		PayloadHash: ev.PayloadHash,
	}
}

func (p *Processor) payload(ev Event) []byte {
	if !p.storePayload {
		return nil
	}
	return ev.Payload
}

// Row statuses in the events table.
const (
	statusInProgress = "in_progress"
	statusDone       = "done"
	statusFailed     = "failed"
)

// maxErrorText bounds the error text stored with a failed event.
const maxErrorText = 2000

// errorText makes err's text storable: valid UTF-8, no NUL, bounded.
func errorText(err error) string {
	s := []rune(err.Error())
	out := make([]rune, 0, min(len(s), maxErrorText))
	for _, r := range s {
		if len(out) == maxErrorText {
			break
		}
		if r == 0 {
			r = '\uFFFD'
		}
		out = append(out, r)
	}
	return string(out)
}

// sqlstateKeyExists is the SQLSTATE with which txhook_raise_key_recorded
// answers a key that is already recorded: the dedupe step's (InsertEvent)
// and inbox mode's accept check's (CheckKeyNotRecorded) answer.
const sqlstateKeyExists = "P0T01"

// isKeyRecorded reports whether err is txhook_raise_key_recorded's: the
// key is recorded, and the statement aborted its transaction.
func isKeyRecorded(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && pgErr.Code == sqlstateKeyExists
}

// isLockTimeout reports whether err is a bounded wait that ran out, which
// means in flight: a lock wait past lock_timeout (55P03), or a statement
// cancelled (57014) by a session statement_timeout shorter than LockTimeout.
func isLockTimeout(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && (pgErr.Code == pgerrcode.LockNotAvailable || pgErr.Code == pgerrcode.QueryCanceled)
}

// untilLeaseEnds is the Retry-After for a key held by a lease.
func untilLeaseEnds(expires pgtype.Timestamptz) time.Duration {
	if !expires.Valid {
		return time.Second
	}
	return max(time.Until(expires.Time), time.Second)
}
