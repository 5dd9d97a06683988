// Package inbox runs txhook's inbox mode on River (github.com/riverqueue/river):
// for senders that never retry (GitHub), give up fast (Shopify), or handlers
// slower than the sender's timeout.
//
// An inbox route (txhook.Routes' Inbox and InboxLease) accepts a verified
// delivery, from the HTTP endpoint or a queue consumer (both through
// txhook.Processor.Deliver): in one transaction it records
// the event (status queued, with its payload and payload hash) and inserts a
// River job whose arguments name only the event's source and key; the
// endpoint answers 202 {"status":"queued"} after COMMIT. River's worker then
// applies the event exactly once through txhook's engine, with the route the
// processor's registry holds for the event's source and type (found from its
// row: the job carries no handler): in one transaction it locks the event's
// row, runs the route's handler and marks the row done;
// the worker then returns and River completes the job, as it completes every
// job (its completer records finished jobs in batches). The event's row, not
// the job, decides what a run does: a job run again (its worker died after
// the COMMIT, before River recorded the completion) finds the event settled
// and only completes. River owns retries, backoff, the rescue of jobs whose
// worker died, and graceful shutdown; txhook owns the dedupe and the
// exactly-once apply.
//
// Completing the job inside the apply's transaction (River's JobCompleteTx)
// would settle both at once, but it is a query of its own in every apply: measured in make bench's end-to-end row,
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
// An accepted event ends applied or as a dead letter (a failed row, replayed
// with txhook.Processor.Replay, the console or the CLI), whatever happens to its
// job. A handler error or panic makes the job fail: River retries it with
// its backoff, and the event stays queued (its row takes the try's number
// and keeps the last error). A txhook.Permanent error records the event as
// failed and cancels the job (river.JobCancel); an error or a panic on the
// job's last attempt records the event as failed too and the job is
// discarded. A job whose event is already settled only completes. A worker
// killed mid-job is rescued by River after Config.River.RescueStuckJobsAfter
// and the event is applied once.
//
// Two failures are never the handler's, and never make a dead letter: a
// shutdown (Stop, StopAndCancel, the end of Start's context) cuts the try
// short, and River runs the job again after the restart without counting it;
// a database fault (txhook.ErrUnavailable, txhook.ErrCommitUnknown) on the
// last attempt snoozes the job (river.JobSnooze) until the database
// answers. An event whose job River gave up on otherwise (a worker killed on
// the last attempt), or that an operator discarded, cancelled or deleted, is
// stuck: every StuckCheckEvery the River leader records such events as failed
// (txhook.Processor.FailStuck), their error naming the job.
//
// Every failed try is logged through the txhook.Processor's logger
// (txhook.Config.Logger): the event, the try's number, the error and the next
// try, or the dead letter. River's own log goes to Config.River.Logger.
//
// # Setup
//
//	if err := inbox.Migrate(ctx, pool); err != nil { ... } // River's schema, next to txhook's
//	routes := txhook.NewRoutes()
//	routes.Inbox("github", "push", onPush)
//	proc, err := txhook.NewProcessor(pool, &txhook.Config{Routes: routes})
//	if err != nil { ... }
//	ib, err := inbox.New(pool, proc, nil) // the processor's queue
//	if err != nil { ... }
//	ep, err := handler.New(proc, &handler.Config{
//		Source:   "github",
//		Provider: &handler.GitHub{Secrets: secrets},
//	})
//	if err := ib.Start(context.WithoutCancel(ctx)); err != nil { ... } // Stop drains
//	defer ib.Stop(shutdownCtx)
package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"

	"github.com/txhook/txhook"
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
	// whose insert sent no notification, the longest such a job waits.
	// River's own is 1 s.
	DefaultFetchPollInterval = 25 * time.Millisecond
)

// Args are the arguments of the River job applying one event: only its
// source and key. The payload lives once, in txhook's events table, and the
// event's route (found from its row's source and type) decides the mode.
type Args struct {
	Source string `json:"source"`
	Key    string `json:"key"`
}

// Kind is River's name for the job.
func (Args) Kind() string { return "txhook_inbox" }

// leaseArgs are the arguments of the jobs that earlier versions inserted
// for lease-mode routes; they are applied as Args are.
type leaseArgs struct {
	Source string `json:"source"`
	Key    string `json:"key"`
}

// Kind is River's name for the job.
func (leaseArgs) Kind() string { return "txhook_inbox_lease" }

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
	// The inbox adds its check for stuck events to River.PeriodicJobs, unless
	// River.LeaderElectionDisabled (River runs periodic jobs on its leader
	// only: another client of the database must then run the check). River
	// logs to River.Logger (by default, warnings and errors to standard
	// output); the inbox's failed tries are logged by the Processor.
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

// StuckCheckEvery is how often the inbox looks for stuck events (queued, or
// in progress with their lease ended, whose River job has ended or is gone
// without applying them) and records them as failed, for a replay: see
// txhook.Processor.FailStuck. It runs as a River periodic job on the
// client's leader, also when the leader starts.
const StuckCheckEvery = time.Minute

// Inbox is the queue of a txhook.Processor's inbox routes (txhook.Routes'
// Inbox and InboxLease), on River: a delivery to such a route inserts its
// job (Enqueue), and River's workers apply the event through the
// processor's routes. It is safe for concurrent use.
type Inbox struct {
	proc        *txhook.Processor
	client      *river.Client[pgx.Tx]
	queue       string
	maxAttempts int
	schema      string                  // River's schema (River.Schema)
	retry       river.ClientRetryPolicy // River's, for the next try of a failed job
	nextTry     sync.Map                // job id -> time.Time: the next try of the try ending (see nextTryOf)
}

// New returns an Inbox whose River client runs on pool and whose workers
// apply events through proc, and makes it proc's queue (UseQueue): a
// Processor has one inbox. River's migrations must be applied (Migrate).
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
		queue:       c.Queue,
		maxAttempts: c.MaxAttempts,
		schema:      rc.Schema,
		retry:       rc.RetryPolicy,
	}
	if ib.retry == nil {
		ib.retry = &river.DefaultClientRetryPolicy{}
	}
	if err := river.AddWorkerSafely(rc.Workers, &txWorker{ib: ib}); err != nil {
		return nil, fmt.Errorf("inbox: add worker: %w", err)
	}
	if err := river.AddWorkerSafely(rc.Workers, &leaseWorker{ib: ib}); err != nil {
		return nil, fmt.Errorf("inbox: add worker: %w", err)
	}
	if err := river.AddWorkerSafely(rc.Workers, &stuckWorker{ib: ib}); err != nil {
		return nil, fmt.Errorf("inbox: add worker: %w", err)
	}
	if !rc.LeaderElectionDisabled { // River runs periodic jobs on its leader only
		rc.PeriodicJobs = append(slices.Clip(rc.PeriodicJobs), river.NewPeriodicJob(
			river.PeriodicInterval(StuckCheckEvery),
			func() (river.JobArgs, *river.InsertOpts) {
				return stuckArgs{}, &river.InsertOpts{Queue: ib.queue, MaxAttempts: 1,
					UniqueOpts: river.UniqueOpts{ByQueue: true}}
			},
			&river.PeriodicJobOpts{ID: stuckArgs{}.Kind() + ":" + ib.queue, RunOnStart: true},
		))
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &rc)
	if err != nil {
		return nil, fmt.Errorf("inbox: new river client: %w", err)
	}
	ib.client = client
	if err := proc.UseQueue(ib); err != nil {
		return nil, fmt.Errorf("inbox: %w", err)
	}
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

// Start starts River's workers and returns. ctx carries the values of the
// workers' contexts and ends the inbox at once when it ends, as
// StopAndCancel does: running applies are cancelled, roll back, and their
// jobs run again when an inbox starts next, the cut try not counted (River
// marks them available), on their last attempt too; no event becomes a dead
// letter for it. To let running applies finish first (a drain), keep ctx
// alive, for example context.Background() or context.WithoutCancel of a
// signal's context, and call Stop on shutdown:
//
//	sig, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
//	defer stop()
//	if err := ib.Start(context.WithoutCancel(sig)); err != nil { ... }
//	<-sig.Done()                                    // SIGTERM: stop taking deliveries first
//	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
//	defer cancel()
//	err := ib.Stop(sctx) // drains; past 30s cancels what still runs (run again after the restart)
func (ib *Inbox) Start(ctx context.Context) error {
	// River's work contexts inherit Start's: its cancellation would end
	// them with its own cause, which River counts as a failed try (and, on
	// the last, discards the job). Stopping the client instead gives them
	// River's stop cause, which it does not count.
	if err := ib.client.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("inbox: start: %w", err)
	}
	stopped := ib.client.Stopped()
	go func() {
		select {
		case <-ctx.Done():
			_ = ib.client.StopAndCancel(context.WithoutCancel(ctx))
		case <-stopped:
		}
	}()
	return nil
}

// Stop stops fetching jobs and waits for running ones to finish (River's
// Stop). When ctx ends first, running jobs are cancelled and awaited
// (StopAndCancel): a cancelled apply rolls back, its event stays queued (a
// lease route's claim is released), and River runs its job again when an
// inbox starts next, without counting the cut try, on its last attempt too.
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

// Enqueue implements txhook.Queue: it inserts, in tx, the River job that
// applies ev (River's InsertTx), whose arguments name only ev's source and
// key. The processor's inbox routes call it; an application does not.
func (ib *Inbox) Enqueue(ctx context.Context, tx pgx.Tx, ev txhook.Event) (int64, error) {
	res, err := ib.client.InsertTx(ctx, tx, Args{Source: ev.Source, Key: ev.Key},
		&river.InsertOpts{Queue: ib.queue, MaxAttempts: ib.maxAttempts})
	if err != nil {
		return 0, fmt.Errorf("insert river job: %w", err)
	}
	return res.Job.ID, nil
}

// txWorker applies the events of the inbox's jobs.
type txWorker struct {
	river.WorkerDefaults[Args]
	ib *Inbox
}

// Work applies one event with txhook.Processor.ApplyQueued, through the
// route of its source and type, in the route's mode.
func (w *txWorker) Work(ctx context.Context, job *river.Job[Args]) error {
	return w.ib.apply(ctx, job.JobRow, job.Args.Source, job.Args.Key)
}

// apply applies the event of the job row.
func (ib *Inbox) apply(ctx context.Context, row *rivertype.JobRow, source, key string) error {
	j := ib.queuedJob(row, source, key)
	res, err := ib.proc.ApplyQueued(ctx, j)
	return ib.jobResult(ctx, row, j, res, err)
}

// NextRetry is when River runs the job again after a failed try: the time
// the try's log showed (River's retry policy's).
func (w *txWorker) NextRetry(job *river.Job[Args]) time.Time { return w.ib.takeNextTry(job.JobRow) }

// leaseWorker applies the jobs of the kind earlier versions inserted for
// lease-mode routes, as txWorker does: the route decides the mode.
type leaseWorker struct {
	river.WorkerDefaults[leaseArgs]
	ib *Inbox
}

// Work applies one event, as txWorker.Work does.
func (w *leaseWorker) Work(ctx context.Context, job *river.Job[leaseArgs]) error {
	return w.ib.apply(ctx, job.JobRow, job.Args.Source, job.Args.Key)
}

// NextRetry is when River runs the job again after a failed try: the time
// the try's log showed (River's retry policy's).
func (w *leaseWorker) NextRetry(job *river.Job[leaseArgs]) time.Time {
	return w.ib.takeNextTry(job.JobRow)
}

// maxFaultWait bounds the wait before the last try of a job runs again
// after a database fault (River's backoff on a 25th try is days).
const maxFaultWait = time.Minute

// queuedJob is the apply's view of the River job row: its try's number,
// whether it is the last, and when River runs it again should it fail
// (nextTryOf).
func (ib *Inbox) queuedJob(row *rivertype.JobRow, source, key string) txhook.QueuedJob {
	ib.nextTry.Delete(row.ID) // an earlier try's, if River did not ask for it
	return txhook.QueuedJob{
		Source:      source,
		Key:         key,
		Attempt:     row.Attempt,
		LastAttempt: row.Attempt >= row.MaxAttempts,
		NextTry:     func() time.Time { return ib.nextTryOf(row) },
	}
}

// nextTryOf returns when River runs the job of row again after the try
// that is ending fails: what River's retry policy says, or, on the last
// attempt, when the wait after a database fault is over (see jobResult).
// It is computed once per try, at its end (the log of the failed try, the
// snooze, or River's call to the worker's NextRetry), and kept until
// River asks for it (takeNextTry), so that the log shows River's time.
func (ib *Inbox) nextTryOf(row *rivertype.JobRow) time.Time {
	if t, ok := ib.nextTry.Load(row.ID); ok {
		return t.(time.Time)
	}
	t := ib.retry.NextRetry(row)
	if row.Attempt >= row.MaxAttempts {
		t = time.Now().Add(min(max(time.Until(t), 0), maxFaultWait))
	}
	ib.nextTry.Store(row.ID, t)
	return t
}

// takeNextTry returns nextTryOf(row) and forgets it.
func (ib *Inbox) takeNextTry(row *rivertype.JobRow) time.Time {
	t := ib.nextTryOf(row)
	ib.nextTry.Delete(row.ID)
	return t
}

// jobResult turns an apply's answer into the job's: nil completes it (River
// records the completion after Work returns), an error retries it,
// JobSnooze waits for a claim held elsewhere, JobCancel ends a job whose
// event was recorded as failed. An error that is not the handler's failure
// never lets River give the job up:
//   - the job's context cancelled (Stop, StopAndCancel, the end of Start's
//     context): the error says so (context.Canceled), and River makes the
//     job available again without counting the try;
//   - a database fault (txhook.ErrUnavailable, txhook.ErrCommitUnknown) on
//     the last attempt: the job is snoozed (nextTryOf: River's backoff, at
//     most maxFaultWait) and tried again, its attempt not counted, until the
//     database answers.
//
// River asks the worker for the next try (NextRetry) only after an error
// it retries; the time kept for it is dropped otherwise.
func (ib *Inbox) jobResult(ctx context.Context, row *rivertype.JobRow, j txhook.QueuedJob, res txhook.Result, err error) error {
	switch {
	case err != nil && errors.Is(ctx.Err(), context.Canceled):
		ib.nextTry.Delete(row.ID)
		if !errors.Is(err, context.Canceled) {
			err = fmt.Errorf("%w (%w)", err, context.Canceled)
		}
		return err
	case err != nil && j.LastAttempt && (errors.Is(err, txhook.ErrUnavailable) || errors.Is(err, txhook.ErrCommitUnknown)):
		return river.JobSnooze(max(time.Until(ib.takeNextTry(row)), 0))
	case err != nil && !j.LastAttempt:
		return err // River asks for the next try
	}
	ib.nextTry.Delete(row.ID)
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

// stuckArgs are the arguments of the periodic job that records stuck
// events as failed.
type stuckArgs struct{}

// Kind is River's name for the job.
func (stuckArgs) Kind() string { return "txhook_inbox_stuck" }

// stuckWorker records the stuck events of the inbox's sources as failed
// (txhook.Processor.FailStuck).
type stuckWorker struct {
	river.WorkerDefaults[stuckArgs]
	ib *Inbox
}

// Work runs one check.
func (w *stuckWorker) Work(ctx context.Context, _ *river.Job[stuckArgs]) error {
	_, err := w.ib.failStuck(ctx)
	return err
}

// failStuck records the stuck events whose jobs are River's, in the
// inbox's schema, as failed.
func (ib *Inbox) failStuck(ctx context.Context) ([]txhook.EventRecord, error) {
	evs, err := ib.proc.FailStuck(ctx, ib.schema, nil)
	if err != nil {
		return nil, fmt.Errorf("inbox: %w", err)
	}
	return evs, nil
}
