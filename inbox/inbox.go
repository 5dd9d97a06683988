// Package inbox runs txhook's inbox mode on River (github.com/riverqueue/river):
// for senders that never retry (GitHub), give up fast (Shopify), or handlers
// slower than the sender's timeout.
//
// An inbox route accepts a verified delivery: in one transaction it records
// the event (status queued, with its payload and payload hash) and inserts a
// River job whose arguments name only the event's source and key; the
// endpoint answers 202 {"status":"queued"} after COMMIT. River's worker then
// applies the event exactly once through txhook's engine: in one transaction
// it locks the event's row, runs the route's handler and marks the row done;
// the worker then returns and River completes the job, as it completes every
// job (its completer records finished jobs in batches). The event's row, not
// the job, decides what a run does: a job run again (its worker died after
// the COMMIT, before River recorded the completion) finds the event settled
// and only completes. River owns retries, backoff, the rescue of jobs whose
// worker died, and graceful shutdown; txhook owns the dedupe and the
// exactly-once apply.
//
// Completing the job inside the apply's transaction (River's JobCompleteTx,
// through txhook.QueuedJob.Complete) would settle both at once, but it is a
// query of its own in every apply: measured in make bench's end-to-end row,
// 0.5 ms of the database's time per event (its batched completer: 0.015 ms
// per job), and 25-35 % fewer events per second end to end.
//
// # Answers
//
//	accepted: event row and job committed          202 {"status":"queued"}
//	redelivery of a queued, running or settled key 200 {"status":"duplicate"} (no second job)
//	concurrent delivery of the same key in flight   409 (or 503) + Retry-After
//	database down, commit outcome unknown           503 + Retry-After
//	(signature, body and key checks as for every route: 4xx, nothing written)
//
// # Jobs
//
// A handler error makes the job fail: River retries it with its backoff,
// and the event stays queued (its row counts the attempts and keeps the
// last error). A txhook.Permanent error records the event as failed (a dead
// letter, replayable with txhook.Replayer) and cancels the job
// (river.JobCancel); an error on the job's last attempt records the event as
// failed too and the job is discarded. A job whose event is already settled
// only completes. A worker killed mid-job is rescued by River after
// Config.River.RescueStuckJobsAfter and the event is applied once.
//
// # Setup
//
//	if err := inbox.Migrate(ctx, pool); err != nil { ... } // River's schema, next to txhook's
//	ib, err := inbox.New(pool, proc, nil)
//	if err != nil { ... }
//	ep, err := handler.New(proc, &handler.Config{
//		Source:   "github",
//		Provider: &handler.GitHub{Secrets: secrets},
//		Routes:   map[string]handler.Route{"push": ib.Tx("github", "push", onPush)},
//	})
//	if err := ib.Start(ctx); err != nil { ... }
//	defer ib.Stop(context.Background())
package inbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
)

// QueueName is the River queue of inbox jobs unless Config.Queue says
// otherwise.
const QueueName = "txhook_inbox"

// Defaults of Config. docs/inbox.md explains the choice, with what each
// costs at idle and under load.
const (
	// DefaultMaxWorkers is how many inbox jobs run at once.
	DefaultMaxWorkers = 50
	// DefaultJobTimeout bounds one try of a job.
	DefaultJobTimeout = time.Minute
	// DefaultFetchCooldown is River's FetchCooldown unless Config.River
	// sets one: the shortest time between two fetches of a queue's jobs,
	// and between two of the insert notifications that wake the queue's
	// workers. With River's own, 100 ms, a queue starts at most MaxWorkers
	// jobs per 100 ms; with River's shortest, 1 ms, accepts wait behind
	// PostgreSQL's lock on notifying commits under load. An event accepted
	// less than a cooldown after the previous notification waits for the
	// next fetch, at the latest the next poll.
	DefaultFetchCooldown = 5 * time.Millisecond
	// DefaultFetchPollInterval is River's FetchPollInterval unless
	// Config.River sets one: how often an idle queue is asked for jobs
	// whose insert sent no notification. River's own is 1 s.
	DefaultFetchPollInterval = 50 * time.Millisecond
)

// Args are the arguments of the River job applying one event of a
// transactional-mode handler: only its source and key. The payload lives
// once, in txhook's events table.
type Args struct {
	Source string `json:"source"`
	Key    string `json:"key"`
}

// Kind is River's name for the job.
func (Args) Kind() string { return "txhook_inbox" }

// LeaseArgs are Args for an event of a lease-mode handler.
type LeaseArgs struct {
	Source string `json:"source"`
	Key    string `json:"key"`
}

// Kind is River's name for the job.
func (LeaseArgs) Kind() string { return "txhook_inbox_lease" }

// Config configures an Inbox. The zero value (or nil) gives the defaults.
type Config struct {
	// River is the River client's configuration, for an application that
	// runs its own jobs on the same client: its workers in River.Workers,
	// its queues in River.Queues, its periodic jobs in River.PeriodicJobs
	// (examples/github-pushes runs its redelivery sweeper so). The inbox
	// adds its worker to River.Workers (creating it when nil) and its queue
	// to River.Queues when missing. Settings River.Config leaves zero get
	// the inbox's defaults, for the whole client (River spaces fetches and
	// insert notifications client-wide): FetchCooldown
	// DefaultFetchCooldown and FetchPollInterval DefaultFetchPollInterval
	// (with River's own, 100 ms and 1 s, a queue starts at most MaxWorkers
	// jobs per 100 ms), JobTimeout DefaultJobTimeout and
	// RescueStuckJobsAfter twice the JobTimeout (River's own default is an
	// hour, which would leave the job of a killed worker waiting that
	// long). Values River.Config sets are kept as they are, except that a
	// FetchPollInterval left zero is never shorter than the FetchCooldown
	// set (River refuses a poll faster than the cooldown), and a
	// FetchCooldown left zero never longer than the FetchPollInterval set.
	// Defaults to a configuration with only the inbox.
	River *river.Config
	// Queue is the River queue of the inbox's jobs. Defaults to QueueName.
	Queue string
	// MaxWorkers is how many jobs of the queue run at once in this process
	// when the inbox adds the queue (a queue in River.Queues keeps its own).
	// Each running job holds one of the pool's connections for its apply:
	// workers beyond the pool's free connections wait for one. Defaults to
	// DefaultMaxWorkers.
	MaxWorkers int
	// MaxAttempts is how many times a job is tried before its event is
	// recorded as failed. Defaults to River's (25, over about three weeks
	// of backoff).
	MaxAttempts int
}

// Inbox accepts events into River and applies them with River's workers.
// Register routes (Tx, Lease) before Start. It is safe for concurrent use.
type Inbox struct {
	proc        *txhook.Processor
	pool        *pgxpool.Pool
	client      *river.Client[pgx.Tx]
	queue       string
	maxAttempts int

	mu       sync.RWMutex
	handlers map[routeKey]txhook.HandlerFunc
	leases   map[routeKey]txhook.LeaseHandler
}

type routeKey struct{ source, eventType string }

// New returns an Inbox whose River client runs on pool and whose workers
// apply events through proc. River's migrations must be applied (Migrate).
func New(pool *pgxpool.Pool, proc *txhook.Processor, cfg *Config) (*Inbox, error) {
	if pool == nil || proc == nil {
		return nil, errors.New("inbox: new: nil pool or processor")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.MaxWorkers < 0 || c.MaxAttempts < 0 {
		return nil, errors.New("inbox: new: negative limit in config")
	}
	if c.Queue == "" {
		c.Queue = QueueName
	}
	if c.MaxWorkers == 0 {
		c.MaxWorkers = DefaultMaxWorkers
	}
	rc := riverConfig(c)
	ib := &Inbox{
		proc:        proc,
		pool:        pool,
		queue:       c.Queue,
		maxAttempts: c.MaxAttempts,
		handlers:    make(map[routeKey]txhook.HandlerFunc),
		leases:      make(map[routeKey]txhook.LeaseHandler),
	}
	if err := river.AddWorkerSafely(rc.Workers, &txWorker{ib: ib}); err != nil {
		return nil, fmt.Errorf("inbox: add worker: %w", err)
	}
	if err := river.AddWorkerSafely(rc.Workers, &leaseWorker{ib: ib}); err != nil {
		return nil, fmt.Errorf("inbox: add worker: %w", err)
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &rc)
	if err != nil {
		return nil, fmt.Errorf("inbox: new river client: %w", err)
	}
	ib.client = client
	return ib, nil
}

// riverConfig is the River client's configuration for c, whose Queue and
// MaxWorkers are set: c.River with the inbox's defaults where it leaves
// settings zero, and the inbox's queue added when missing.
func riverConfig(c Config) river.Config {
	var rc river.Config
	if c.River != nil {
		rc = *c.River
	}
	if rc.Workers == nil {
		rc.Workers = river.NewWorkers()
	}
	switch {
	case rc.FetchCooldown == 0 && rc.FetchPollInterval == 0:
		rc.FetchCooldown, rc.FetchPollInterval = DefaultFetchCooldown, DefaultFetchPollInterval
	case rc.FetchCooldown == 0:
		rc.FetchCooldown = min(DefaultFetchCooldown, rc.FetchPollInterval)
	case rc.FetchPollInterval == 0:
		rc.FetchPollInterval = max(DefaultFetchPollInterval, rc.FetchCooldown)
	}
	if rc.JobTimeout == 0 {
		rc.JobTimeout = DefaultJobTimeout
	}
	if rc.RescueStuckJobsAfter == 0 && rc.JobTimeout > 0 {
		rc.RescueStuckJobsAfter = 2 * rc.JobTimeout
	}
	queues := make(map[string]river.QueueConfig, len(rc.Queues)+1)
	for n, q := range rc.Queues {
		queues[n] = q
	}
	if _, ok := queues[c.Queue]; !ok {
		queues[c.Queue] = river.QueueConfig{MaxWorkers: c.MaxWorkers}
	}
	rc.Queues = queues
	return rc
}

// Migrate applies River's migrations to the database of pool, next to
// txhook's own (migrations.Up). It works on a fresh database and on one that
// already runs River (a database already current is left as it is).
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return fmt.Errorf("new river migrator: %w", err)
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrate river: %w", err)
	}
	return nil
}

// Client returns the River client, for the application's own jobs.
func (ib *Inbox) Client() *river.Client[pgx.Tx] { return ib.client }

// Start starts River's workers. ctx is the workers' base context.
func (ib *Inbox) Start(ctx context.Context) error {
	if err := ib.client.Start(ctx); err != nil {
		return fmt.Errorf("inbox: start: %w", err)
	}
	return nil
}

// Stop stops fetching jobs and waits for running ones to finish (River's
// Stop). When ctx ends first, running jobs are cancelled and awaited
// (StopAndCancel): a cancelled apply rolls back and River retries its job,
// counting the attempt (on the last attempt the event is recorded as
// failed, for a replay).
func (ib *Inbox) Stop(ctx context.Context) error {
	err := ib.client.Stop(ctx)
	if err != nil && ctx.Err() != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		err = ib.client.StopAndCancel(cctx)
	}
	if err != nil {
		return fmt.Errorf("inbox: stop: %w", err)
	}
	return nil
}

// Tx registers h as the transactional handler of source's events of
// eventType ("" for every type without a handler of its own) and returns the
// endpoint route that accepts them into the inbox.
func (ib *Inbox) Tx(source, eventType string, h txhook.HandlerFunc) handler.Route {
	ib.mu.Lock()
	ib.handlers[routeKey{source, eventType}] = h
	ib.mu.Unlock()
	return &route{ib: ib, lease: false}
}

// Lease registers h as the lease-mode handler of source's events of
// eventType ("" for every type without a handler of its own) and returns the
// endpoint route that accepts them into the inbox. Phase one runs in the
// job under a claim with a fencing token, renewed while it runs; phase two
// commits with the done mark, and River then completes the job.
func (ib *Inbox) Lease(source, eventType string, h txhook.LeaseHandler) handler.Route {
	ib.mu.Lock()
	ib.leases[routeKey{source, eventType}] = h
	ib.mu.Unlock()
	return &route{ib: ib, lease: true}
}

// HandlerLookup returns the lookup of source's transactional handlers
// registered with Tx, for replaying its failed events with
// txhook.NewReplayer (a failed inbox event keeps its payload).
func (ib *Inbox) HandlerLookup(source string) txhook.HandlerLookup {
	return func(eventType string) (txhook.HandlerFunc, bool) { return ib.txHandler(source, eventType) }
}

func (ib *Inbox) txHandler(source, eventType string) (txhook.HandlerFunc, bool) {
	ib.mu.RLock()
	defer ib.mu.RUnlock()
	return lookup(ib.handlers, source, eventType)
}

func (ib *Inbox) leaseHandler(source, eventType string) (txhook.LeaseHandler, bool) {
	ib.mu.RLock()
	defer ib.mu.RUnlock()
	return lookup(ib.leases, source, eventType)
}

// lookup returns the handler in m of source's events of eventType, or the
// one registered for all of source's types ("") without a handler of
// their own.
func lookup[H any](m map[routeKey]H, source, eventType string) (H, bool) {
	if h, ok := m[routeKey{source, eventType}]; ok {
		return h, true
	}
	h, ok := m[routeKey{source, ""}]
	return h, ok
}

// Accept accepts ev into the inbox outside an HTTP endpoint (from a queue
// consumer, a test): it records ev as queued and inserts its job in one
// transaction on the processor's database, as the inbox routes do.
// Outcomes and errors are txhook.Processor.Accept's. lease selects the
// lease-mode job (see Lease).
func (ib *Inbox) Accept(ctx context.Context, ev txhook.Event, lease bool) (txhook.Result, error) {
	return ib.proc.Accept(ctx, ev, nil, ib.enqueue(lease))
}

func (ib *Inbox) enqueue(lease bool) txhook.EnqueueFunc {
	return func(ctx context.Context, tx pgx.Tx, ev txhook.Event) (int64, error) {
		var args river.JobArgs = Args{Source: ev.Source, Key: ev.Key}
		if lease {
			args = LeaseArgs{Source: ev.Source, Key: ev.Key}
		}
		res, err := ib.client.InsertTx(ctx, tx, args, &river.InsertOpts{Queue: ib.queue, MaxAttempts: ib.maxAttempts})
		if err != nil {
			return 0, fmt.Errorf("insert river job: %w", err)
		}
		return res.Job.ID, nil
	}
}

// route is an inbox route: it accepts events into the inbox.
type route struct {
	ib    *Inbox
	lease bool
	guard *txhook.ReplayGuard
}

// Apply implements handler.Route with txhook.Processor.Accept.
func (r *route) Apply(ctx context.Context, p *txhook.Processor, ev txhook.Event) (txhook.Result, error) {
	return p.Accept(ctx, ev, r.guard, r.ib.enqueue(r.lease))
}

// WithGuard implements handler.GuardedRoute: the guard's check runs in the
// accepting transaction.
func (r *route) WithGuard(g txhook.ReplayGuard) handler.Route {
	c := *r
	c.guard = &g
	return &c
}

// txWorker applies the events of transactional-mode handlers.
type txWorker struct {
	river.WorkerDefaults[Args]
	ib *Inbox
}

// Work applies one event with txhook.Processor.ApplyQueued.
func (w *txWorker) Work(ctx context.Context, job *river.Job[Args]) error {
	ib := w.ib
	source := job.Args.Source
	j := txhook.QueuedJob{
		Source:      source,
		Key:         job.Args.Key,
		LastAttempt: job.Attempt >= job.MaxAttempts,
	}
	res, err := ib.proc.ApplyQueued(ctx, j, func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		h, ok := ib.txHandler(source, ev.Type)
		if !ok {
			return txhook.Permanent(fmt.Errorf("%w %q of source %q", txhook.ErrNoHandler, ev.Type, source))
		}
		return h(ctx, tx, ev)
	})
	return jobResult(j, res, err)
}

// leaseWorker applies the events of lease-mode handlers.
type leaseWorker struct {
	river.WorkerDefaults[LeaseArgs]
	ib *Inbox
}

// Work applies one event with txhook.Processor.ApplyQueuedLease.
func (w *leaseWorker) Work(ctx context.Context, job *river.Job[LeaseArgs]) error {
	ib := w.ib
	j := txhook.QueuedJob{
		Source:      job.Args.Source,
		Key:         job.Args.Key,
		LastAttempt: job.Attempt >= job.MaxAttempts,
	}
	rec, err := txhook.GetEventRecord(ctx, ib.pool, j.Source, j.Key)
	switch {
	case errors.Is(err, txhook.ErrEventNotFound):
		return nil // gone (pruned): nothing to apply
	case err != nil:
		return err
	}
	h, ok := ib.leaseHandler(j.Source, rec.Type)
	if !ok {
		// Recorded as failed, as on a transactional route, through the
		// claim: an operator replays it once a handler is registered.
		h = failLease(fmt.Errorf("%w %q of source %q", txhook.ErrNoHandler, rec.Type, j.Source))
	}
	res, err := ib.proc.ApplyQueuedLease(ctx, j, h)
	return jobResult(j, res, err)
}

// failLease is the lease handler of an event without one: its work fails
// for good with err.
func failLease(err error) txhook.LeaseHandler {
	return txhook.LeaseHandler{Work: func(context.Context, txhook.Claim, txhook.Event) (txhook.TxFunc, error) {
		return nil, txhook.Permanent(err)
	}}
}

// jobResult turns an apply's answer into the job's: nil completes it (River
// records the completion after Work returns), an error retries it,
// JobSnooze waits for a claim held elsewhere, JobCancel ends a job whose
// event was recorded as failed.
func jobResult(j txhook.QueuedJob, res txhook.Result, err error) error {
	if err != nil {
		return err
	}
	switch res.Outcome {
	case txhook.OutcomeInFlight:
		return river.JobSnooze(max(res.RetryAfter, time.Second))
	case txhook.OutcomeFailed:
		if j.LastAttempt {
			return res.Err // discarded: no attempt left
		}
		return river.JobCancel(res.Err)
	}
	return nil
}
