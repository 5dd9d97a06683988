package txhook

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/txhook/txhook/db"
)

// DefaultRetention is how long finished events are kept before pruning
// deletes them. A pruned key no longer deduplicates, so the retention must
// outlast every automatic retry and manual redelivery of the providers in
// use: Stripe retries for 3 days, GitHub allows redelivery for 3 days and
// Shopify retries for 4 hours.
const DefaultRetention = 14 * 24 * time.Hour

// DefaultPruneBatchSize is how many rows one pruning transaction deletes at
// most, unless PruneOptions.BatchSize says otherwise.
const DefaultPruneBatchSize = 1000

// pruneLockKey is the PostgreSQL advisory lock (pg_try_advisory_xact_lock)
// that keeps pruners on several instances from running at the same time:
// 0x7478686f6f6b5052, "txhookPR".
const pruneLockKey int64 = 0x7478686f6f6b5052

// PruneOptions configures Prune. The zero value deletes done events
// completed more than DefaultRetention ago, in batches of
// DefaultPruneBatchSize rows.
type PruneOptions struct {
	// OlderThan is the retention: rows completed longer ago than this are
	// deleted. Defaults to DefaultRetention.
	OlderThan time.Duration
	// IncludeFailed also deletes failed events (dead letters) older than
	// OlderThan. Defaults to false: failed events stay until replayed or
	// deleted on purpose.
	IncludeFailed bool
	// BatchSize bounds the rows deleted by one transaction. Defaults to
	// DefaultPruneBatchSize.
	BatchSize int
	// DryRun counts the rows that would be deleted and deletes nothing.
	DryRun bool
	// Progress, when set, is called after each committed batch with the
	// number of rows deleted so far.
	Progress func(deleted int64)
}

func (o PruneOptions) withDefaults() (PruneOptions, error) {
	if o.OlderThan < 0 {
		return o, errors.New("txhook: prune: negative retention")
	}
	if o.BatchSize < 0 || o.BatchSize > 1<<30 {
		return o, errors.New("txhook: prune: batch size out of range")
	}
	if o.OlderThan == 0 {
		o.OlderThan = DefaultRetention
	}
	if o.BatchSize == 0 {
		o.BatchSize = DefaultPruneBatchSize
	}
	return o, nil
}

// PruneResult describes a finished call to Prune.
type PruneResult struct {
	// Deleted is the number of rows deleted; with DryRun, the number of
	// rows that would have been.
	Deleted int64
	// Batches is the number of deleting transactions committed.
	Batches int
	// Cutoff is the completion time before which rows were deleted, on the
	// database's clock.
	Cutoff time.Time
	// Locked reports that another pruner held the pruning lock, so this one
	// stopped early (after Deleted rows); the other finishes the work.
	Locked bool
}

// Prune deletes done events (and, with IncludeFailed, failed events) that
// completed more than opts.OlderThan ago. It never deletes in-progress rows.
//
// Rows are deleted in batches of opts.BatchSize, one short transaction per
// batch, until a batch finds fewer rows than that. Each batch takes the
// advisory lock 0x7478686f6f6b5052 ("txhookPR", one bigint) for its
// transaction: while one pruner is
// deleting, another stops and reports Locked, so across instances at most one
// pruner deletes at a time and the last to take the lock finishes the work.
// Rows locked by a concurrent replay are skipped and left for the next run.
// The cutoff is taken once, from the database clock, at the start. Each
// batch also records the run in txhook_prune_runs (its start, last batch,
// cutoff and rows deleted so far), which the operator console shows.
//
// ctx bounds the whole run; when it ends, Prune returns what it deleted so
// far with ctx's error. Committed batches stay deleted.
func Prune(ctx context.Context, b Beginner, opts PruneOptions) (PruneResult, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return PruneResult{}, err
	}
	if b == nil {
		return PruneResult{}, errors.New("txhook: prune: nil database")
	}
	olderThan := pgtype.Interval{Microseconds: o.OlderThan.Microseconds(), Valid: true}
	var res PruneResult
	var cutoff pgtype.Timestamptz
	if o.DryRun {
		err := Run(ctx, b, &TxOptions{AccessMode: pgx.ReadOnly}, func(ctx context.Context, tx pgx.Tx) error {
			q := db.New(tx)
			c, err := q.PruneCutoff(ctx, olderThan)
			if err != nil {
				return fmt.Errorf("read cutoff: %w", err)
			}
			cutoff = c.Cutoff
			res.Deleted, err = q.CountPrunable(ctx, db.CountPrunableParams{IncludeFailed: o.IncludeFailed, Cutoff: cutoff})
			if err != nil {
				return fmt.Errorf("count prunable events: %w", err)
			}
			return nil
		})
		res.Cutoff = cutoff.Time
		if err != nil {
			return res, fmt.Errorf("prune: %w", err)
		}
		return res, nil
	}
	var started pgtype.Timestamptz // the run's start, read with the cutoff: the clock of last_batch_at
	for {
		var n int64
		var locked bool
		err := Run(ctx, b, nil, func(ctx context.Context, tx pgx.Tx) error {
			q := db.New(tx)
			var err error
			if locked, err = q.TryPruneLock(ctx, pruneLockKey); err != nil {
				return fmt.Errorf("take prune lock: %w", err)
			}
			if !locked {
				return errRollback
			}
			if !cutoff.Valid {
				c, err := q.PruneCutoff(ctx, olderThan)
				if err != nil {
					return fmt.Errorf("read cutoff: %w", err)
				}
				started, cutoff = c.Now, c.Cutoff
			}
			n, err = q.PruneBatch(ctx, db.PruneBatchParams{
				IncludeFailed: o.IncludeFailed,
				Cutoff:        cutoff,
				BatchSize:     int32(o.BatchSize),
			})
			if err != nil {
				return fmt.Errorf("delete batch: %w", err)
			}
			if err := q.RecordPruneBatch(ctx, db.RecordPruneBatchParams{
				StartedAt: started, Cutoff: cutoff, IncludeFailed: o.IncludeFailed, Deleted: n,
			}); err != nil {
				return fmt.Errorf("record prune batch: %w", err)
			}
			return nil
		})
		res.Cutoff = cutoff.Time
		switch {
		case errors.Is(err, errRollback):
			res.Locked = true
			return res, nil
		case err != nil:
			return res, fmt.Errorf("prune: %w", err)
		}
		res.Deleted += n
		res.Batches++
		if o.Progress != nil {
			o.Progress(res.Deleted)
		}
		if n < int64(o.BatchSize) {
			return res, nil
		}
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("prune: %w", err)
		}
	}
}

// PrunerConfig configures a Pruner. The zero value (or nil) prunes with the
// default PruneOptions once an hour.
type PrunerConfig struct {
	// Interval is the time between the end of one run and the start of the
	// next. Defaults to 1h.
	Interval time.Duration
	// Options are the options of each run; DryRun and Progress are ignored.
	// Defaults to the zero PruneOptions (DefaultRetention, done rows only).
	Options PruneOptions
	// Logger receives one record per run that deleted rows or failed.
	// Defaults to slog.Default().
	Logger *slog.Logger
	// BodyDedupeWindow is the longest body dedupe window of the application's
	// guarded endpoints (handler.Config.BodyDedupeWindow; providers with
	// unsigned event keys, GitHub and Shopify, are guarded by default).
	// The body dedupe finds a replayed body by the rows pruning deletes,
	// so a retention (Options.OlderThan) shorter than the window shortens
	// the guard's memory to the retention: Run logs a warning when it is.
	// Defaults to DefaultRetention, the guard's default window; a negative
	// value means no endpoint is guarded, and no warning.
	BodyDedupeWindow time.Duration
}

// Pruner runs Prune in the background, for applications that do not prune
// from a scheduled job (txhook prune). Any number of instances may run one:
// the pruning lock lets one of them delete at a time.
type Pruner struct {
	db       Beginner
	interval time.Duration
	opts     PruneOptions
	logger   *slog.Logger
	window   time.Duration // BodyDedupeWindow; <= 0: none
}

// NewPruner returns a Pruner that prunes the events table in db.
func NewPruner(db Beginner, cfg *PrunerConfig) (*Pruner, error) {
	if db == nil {
		return nil, errors.New("txhook: new pruner: nil database")
	}
	var c PrunerConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Interval < 0 {
		return nil, errors.New("txhook: new pruner: negative interval")
	}
	if c.Interval == 0 {
		c.Interval = time.Hour
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.BodyDedupeWindow == 0 {
		c.BodyDedupeWindow = DefaultRetention
	}
	c.Options.DryRun = false
	c.Options.Progress = nil
	opts, err := c.Options.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("txhook: new pruner: %w", err)
	}
	return &Pruner{db: db, interval: c.Interval, opts: opts, logger: c.Logger, window: c.BodyDedupeWindow}, nil
}

// Run prunes at once and then every Interval until ctx ends. Errors are
// logged and the next run tries again. Run returns when ctx ends, after
// stopping a run in progress between batches. It first logs a warning when
// the retention is shorter than PrunerConfig.BodyDedupeWindow.
func (p *Pruner) Run(ctx context.Context) {
	if p.opts.OlderThan < p.window {
		p.logger.WarnContext(ctx, "txhook: prune retention is shorter than the body dedupe window: the body dedupe forgets bodies once their rows are pruned; set PrunerConfig.BodyDedupeWindow to the longest window of the guarded endpoints (negative if none)",
			"retention", p.opts.OlderThan, "replay_window", p.window)
	}
	for {
		res, err := Prune(ctx, p.db, p.opts)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			p.logger.ErrorContext(ctx, "txhook: prune events", "error", err, "deleted", res.Deleted)
		case res.Deleted > 0:
			p.logger.InfoContext(ctx, "txhook: pruned events", "deleted", res.Deleted,
				"batches", res.Batches, "cutoff", res.Cutoff, "stopped_for_other_pruner", res.Locked)
		}
		if sleepCtx(ctx, p.interval) != nil {
			return
		}
	}
}
