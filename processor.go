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
// effects outside tx (use lease mode for those).
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
	// StorePayload keeps each event's payload in the events table so that
	// failed events can be replayed. Defaults to false.
	StorePayload bool
	// Tx configures the transactions (isolation level, retries). Defaults to
	// the zero TxOptions.
	Tx *TxOptions
	// DedupeWithFirstStatement makes Process send BEGIN and the dedupe step
	// in the same round trip as the handler's first statement, instead of
	// one round trip before the handler runs: a new event costs one round
	// trip fewer. The handler then starts before its key is known to be
	// new. When the key is already committed or held by another delivery,
	// its first statement runs and is rolled back, that statement and every
	// later one return ErrNotNew, and the outcome is duplicate or in flight
	// whatever the handler returns. Use it for handlers that do nothing
	// but decode, check and write through tx (what a transactional handler
	// should do): code before their first statement runs for every
	// delivery. A handler's first QueryRow is sent when its row is scanned,
	// and a first Query, SendBatch, CopyFrom or Prepare after the dedupe
	// step. It applies to Process on a *pgxpool.Pool, *pgxpool.Conn or
	// *pgx.Conn; ProcessTx and lease mode are unchanged.
	DedupeWithFirstStatement bool
	// RecentKeys is how many event keys a Processor remembers after seeing
	// them settled (committed as done or failed, by itself or by anyone),
	// so that Process answers a redelivery of one as a duplicate without a
	// round trip to the database. A settled key stays settled while its row
	// exists, and rows are pruned only after the events table's retention,
	// far past RecentKeysTTL, so the memory answers as the database would;
	// the exception is a row deleted by hand to have its event processed
	// again, which a Processor that remembers the key sees only once
	// RecentKeysTTL has passed. Defaults to DefaultRecentKeys (10,000 keys,
	// about 2 MB); a negative value turns the memory off.
	RecentKeys int
	// RecentKeysTTL is how long a settled key is remembered. Defaults to
	// DefaultRecentKeysTTL (10 minutes).
	RecentKeysTTL time.Duration
}

// Processor applies events exactly once. It is safe for concurrent use, and
// any number of processes may share one database: the unique key in the
// events table arbitrates between them.
//
// On a pool or a connection, Process sends BEGIN and the dedupe step in one
// round trip (a pgx batch): a new event then costs the handler's statements
// and two more round trips, that one and COMMIT, and a duplicate two (that
// one and ROLLBACK). With Config.DedupeWithFirstStatement, that batch also
// carries the handler's first statement: a new event costs one round trip
// fewer. The writes a handler sends through Deferred travel with its next
// statement or with COMMIT. While more than half of the recent deliveries
// were duplicates, as in a provider's redelivery storm, Process first reads
// whether the key is already settled, outside any transaction: a duplicate
// costs one round trip and a new event one more than usual. A key the
// Processor itself saw settled recently is answered from memory, with no
// round trip (Config.RecentKeys).
type Processor struct {
	db           Beginner
	lockTimeout  string
	inFlightWait time.Duration
	maxKeyLen    int
	storePayload bool
	withFirst    bool // Config.DedupeWithFirstStatement
	txOpts       TxOptions
	crash        crasher
	// direct runs statements outside any transaction (the duplicate read,
	// lease mode's claim and release); nil when db only begins
	// transactions: the read is then off and lease mode's statements run
	// in transactions of their own.
	direct db.DBTX
	dups   dupShare
	recent *recentKeys // nil when Config.RecentKeys is negative
}

// NewProcessor returns a Processor that runs transactions on db, usually a
// *pgxpool.Pool. The database must have txhook's migrations applied (see the
// migrations package). On a *pgxpool.Pool, *pgxpool.Conn or *pgx.Conn, BEGIN
// shares a round trip with the transaction's first statement; any other
// Beginner (a wrapper) gets a BEGIN of its own, and the duplicate read (see
// Processor) only when it also runs statements directly (pgx's Exec, Query
// and QueryRow).
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
	ms := c.LockTimeout.Milliseconds()
	if ms < 1 {
		ms = 1
	}
	return &Processor{
		db:           db,
		direct:       direct(db),
		lockTimeout:  fmt.Sprintf("%dms", ms),
		inFlightWait: c.InFlightRetryAfter,
		maxKeyLen:    c.MaxKeyLen,
		storePayload: c.StorePayload,
		withFirst:    c.DedupeWithFirstStatement,
		txOpts:       c.Tx.withDefaults(),
		crash:        newCrasherFromEnv(),
		recent:       newRecentKeys(c.RecentKeys, c.RecentKeysTTL),
	}, nil
}

// Process applies ev exactly once: in one transaction it records ev's key
// and runs h; both commit or neither does.
//
// A nil error comes with one of the outcomes: processed (h ran and
// committed), duplicate (the key was already committed; h did not run, or
// under Config.DedupeWithFirstStatement its work was rolled back), in
// flight (another delivery holds the key; likewise) or failed (h returned a
// PermanentError, recorded). Any error means nothing was
// committed, except a *CommitUnknownError, which means the outcome cannot be
// known; in both cases the event must not be acknowledged, so that the
// sender retries. Invalid input returns a *ValidationError (ErrInvalidEvent)
// and writes nothing.
//
// ctx bounds the work up to COMMIT; see RunTx.
func (p *Processor) Process(ctx context.Context, ev Event, h HandlerFunc) (Result, error) {
	if err := p.check(ev, h); err != nil {
		return Result{}, err
	}
	if p.recent.settled(ev) {
		p.dups.observe(true)
		return Result{Outcome: OutcomeDuplicate}, nil
	}
	if p.direct != nil && p.dups.mostly() {
		// A redelivery storm: a duplicate costs one read (see dupShare).
		settled, err := p.settled(ctx, ev)
		if err != nil {
			return Result{}, err
		}
		if settled {
			p.dups.observe(true)
			p.recent.remember(ev)
			return Result{Outcome: OutcomeDuplicate}, nil
		}
	}
	res, err := p.process(ctx, ev, h)
	if err == nil && res.Outcome != OutcomeInFlight {
		p.dups.observe(res.Outcome == OutcomeDuplicate)
		// Processed, failed or duplicate: the key's row is committed as
		// done or failed.
		p.recent.remember(ev)
	}
	return res, err
}

// process is Process after validation and the duplicate read.
func (p *Processor) process(ctx context.Context, ev Event, h HandlerFunc) (Result, error) {
	if s := pipeliner(p.db); s != nil {
		return p.processPipelined(ctx, s, ev, h)
	}
	// A database that only begins transactions (a wrapper): BEGIN, the
	// dedupe step as the transaction's first statement, and the handler
	// only for a new key; Deferred statements run at once.
	var res Result
	dedupe := func(ctx context.Context, q db.DBTX) error {
		var err error
		res, err = p.dedupe(ctx, q, ev)
		return err
	}
	err := runTx(ctx, p.db, p.txOpts, dedupe, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		res, err = p.handle(ctx, tx, ev, h)
		return err
	}, func() { p.crash.at(CrashBeforeCommit) })
	return p.finish(ctx, ev, res, err)
}

// finish turns the outcome of an event's transaction into Process's answer.
func (p *Processor) finish(ctx context.Context, ev Event, res Result, err error) (Result, error) {
	switch {
	case err == nil:
		p.crash.at(CrashAfterCommit)
		return res, nil
	case errors.Is(err, errRollback):
		return res, nil
	case IsPermanent(err):
		return p.recordFailed(ctx, ev, err)
	}
	return Result{}, err
}

// ProcessTx is Process inside tx, a transaction the caller owns: the key and
// h's writes commit when the caller commits tx. It runs under a savepoint, so
// a duplicate, an in-flight key or an error from h rolls back only its own
// work and leaves tx usable. It does not retry; the caller must not
// acknowledge the event before tx commits.
func (p *Processor) ProcessTx(ctx context.Context, tx pgx.Tx, ev Event, h HandlerFunc) (Result, error) {
	if err := p.check(ev, h); err != nil {
		return Result{}, err
	}
	var res Result
	err := RunNestedTx(ctx, tx, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		res, err = p.apply(ctx, tx, ev, h)
		return err
	})
	switch {
	case err == nil:
		return res, nil
	case errors.Is(err, errRollback):
		return res, nil
	case IsPermanent(err):
		n, ierr := db.New(tx).InsertFailedEvent(ctx, p.failedParams(ev, err))
		if ierr != nil {
			return Result{}, fmt.Errorf("record failed event: %w", ierr)
		}
		if n == 0 {
			return Result{Outcome: OutcomeDuplicate}, nil
		}
		return Result{Outcome: OutcomeFailed, Err: err}, nil
	}
	return Result{}, err
}

func (p *Processor) check(ev Event, h HandlerFunc) error {
	if h == nil {
		return errors.New("txhook: process: nil handler")
	}
	return ev.validate(p.maxKeyLen)
}

// apply runs the dedupe step and, for a new key, the handler. It returns
// errRollback (with the result) when there is nothing to commit.
func (p *Processor) apply(ctx context.Context, tx pgx.Tx, ev Event, h HandlerFunc) (Result, error) {
	if res, err := p.dedupe(ctx, tx, ev); err != nil {
		return res, err
	}
	return p.handle(ctx, tx, ev, h)
}

// dedupe records ev's key in the transaction q runs in. A nil error means the
// key is new and the transaction owns it; a duplicate or in-flight key
// returns its result with errRollback.
func (p *Processor) dedupe(ctx context.Context, q db.DBTX, ev Event) (Result, error) {
	row, err := db.New(q).InsertEvent(ctx, db.InsertEventParams{
		Source:      ev.Source,
		EventKey:    ev.Key,
		EventType:   ev.Type,
		Payload:     p.payload(ev),
		PayloadHash: ev.PayloadHash,
		LockTimeout: p.lockTimeout,
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Result{Outcome: OutcomeDuplicate}, errRollback
	case isLockTimeout(err):
		return Result{Outcome: OutcomeInFlight, RetryAfter: p.inFlightWait}, errRollback
	case err != nil:
		return Result{}, fmt.Errorf("insert event key: %w", err)
	case row.Status != statusDone:
		return Result{Outcome: OutcomeInFlight, RetryAfter: untilLeaseEnds(row.LeaseExpiresAt)}, errRollback
	}
	p.crash.at(CrashAfterInsert)
	return Result{}, nil
}

// handle runs h for a key dedupe found new.
func (p *Processor) handle(ctx context.Context, tx pgx.Tx, ev Event, h HandlerFunc) (Result, error) {
	return p.handled(h(ctx, tx, ev))
}

// handled turns the handler's return for a new key into the attempt's
// result: a permanent error as it is (it is recorded as failed), any other
// wrapped (it rolls back), nil as processed.
func (p *Processor) handled(herr error) (Result, error) {
	if herr != nil {
		if IsPermanent(herr) {
			return Result{}, herr
		}
		return Result{}, fmt.Errorf("handle event: %w", herr)
	}
	p.crash.at(CrashAfterHandler)
	return Result{Outcome: OutcomeProcessed}, nil
}

func (p *Processor) recordFailed(ctx context.Context, ev Event, perr error) (Result, error) {
	var n int64
	err := RunTx(ctx, p.db, &p.txOpts, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		n, err = db.New(tx).InsertFailedEvent(ctx, p.failedParams(ev, perr))
		return err
	})
	if err != nil {
		return Result{}, fmt.Errorf("record failed event: %w", errors.Join(err, perr))
	}
	if n == 0 {
		// Another delivery committed the key in the meantime.
		return Result{Outcome: OutcomeDuplicate}, nil
	}
	return Result{Outcome: OutcomeFailed, Err: perr}, nil
}

func (p *Processor) failedParams(ev Event, perr error) db.InsertFailedEventParams {
	return db.InsertFailedEventParams{
		Source:      ev.Source,
		EventKey:    ev.Key,
		EventType:   ev.Type,
		LastError:   pgtype.Text{String: errorText(perr), Valid: true},
		Payload:     p.payload(ev),
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

// isLockTimeout reports whether err is a bounded wait that ran out, which
// means in flight: a lock wait past lock_timeout (55P03), or a statement
// cancelled (57014) by a session statement_timeout shorter than LockTimeout.
func isLockTimeout(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && (pgErr.Code == "55P03" || pgErr.Code == "57014")
}

// untilLeaseEnds is the Retry-After for a key held by a lease.
func untilLeaseEnds(expires pgtype.Timestamptz) time.Duration {
	if !expires.Valid {
		return time.Second
	}
	return max(time.Until(expires.Time), time.Second)
}
