package txhook_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
)

// onlyBegins is a database wrapper (as an instrumented or multi-tenant
// wrapper would be) that only begins transactions: a Processor on it cannot
// pipeline and takes the path for such databases.
type onlyBegins struct{ pool *pgxpool.Pool }

func (w onlyBegins) BeginTx(ctx context.Context, o pgx.TxOptions) (pgx.Tx, error) {
	return w.pool.BeginTx(ctx, o)
}

// beginsAndRuns is a wrapper that also runs statements directly, as
// tracing wrappers do: still not a pool or a connection.
type beginsAndRuns struct{ pool *pgxpool.Pool }

func (w beginsAndRuns) BeginTx(ctx context.Context, o pgx.TxOptions) (pgx.Tx, error) {
	return w.pool.BeginTx(ctx, o)
}

func (w beginsAndRuns) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return w.pool.Exec(ctx, sql, args...)
}

func (w beginsAndRuns) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return w.pool.Query(ctx, sql, args...)
}

func (w beginsAndRuns) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return w.pool.QueryRow(ctx, sql, args...)
}

// wrappers are the databases of the wrapper tests, each with the Config
// options that touch the pipelined path (they must change nothing here).
func wrappers(pool *pgxpool.Pool) []struct {
	name string
	db   txhook.Beginner
	cfg  txhook.Config
} {
	return []struct {
		name string
		db   txhook.Beginner
		cfg  txhook.Config
	}{
		{"begin only", onlyBegins{pool}, txhook.Config{RecentKeys: -1}},
		{"begin only, dedupe with first statement", onlyBegins{pool}, txhook.Config{RecentKeys: -1, DedupeWithFirstStatement: true}},
		{"with statements", beginsAndRuns{pool}, txhook.Config{RecentKeys: -1}},
	}
}

func (b *bundle) keyRows(t *testing.T, key string) int {
	t.Helper()
	return b.count(t, "SELECT count(*) FROM txhook_processed_events WHERE event_key = $1", key)
}

// TestWrapperHandlerFailureLeavesNothing: through a database wrapper, a
// handler that fails after writing (an error, a panic, or statements
// deferred to COMMIT) leaves neither its writes nor the event's key, and the
// sender's retry processes the event; a permanent failure records the key
// as failed, still without the writes.
func TestWrapperHandlerFailureLeavesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	errLate := errors.New("downstream row missing")
	for _, w := range wrappers(b.pool) {
		t.Run(w.name, func(t *testing.T) {
			p, err := txhook.NewProcessor(w.db, &w.cfg)
			if err != nil {
				t.Fatal(err)
			}
			for _, tc := range []struct {
				name string
				h    txhook.HandlerFunc
			}{
				{"error", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
					if err := insertEffect(ctx, tx, ev); err != nil {
						return err
					}
					return errLate
				}},
				{"deferred write then error", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
					if err := insertEffect(ctx, tx, ev); err != nil {
						return err
					}
					if _, err := txhook.Deferred(tx).Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'deferred')", ev.Key); err != nil {
						return err
					}
					return errLate
				}},
				{"panic", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
					if err := insertEffect(ctx, tx, ev); err != nil {
						return err
					}
					panic(errLate)
				}},
			} {
				ev := event("evt_wrapper_" + w.name + "_" + tc.name)
				func() {
					defer func() {
						if v := recover(); v != nil && v != errLate {
							panic(v)
						}
					}()
					res, err := p.Process(boundedCtx(t), ev, tc.h)
					if !errors.Is(err, errLate) {
						t.Errorf("%s: Process = %v, %v; want the handler's error", tc.name, res, err)
					}
				}()
				if n := b.effects(t, ev.Key); n != 0 {
					t.Errorf("%s: %d effects committed, want none", tc.name, n)
				}
				if n := b.keyRows(t, ev.Key); n != 0 {
					t.Errorf("%s: the key was committed without its handler's writes", tc.name)
				}
				mustProcess(t, p, ev, insertEffect, txhook.OutcomeProcessed)
				if n := b.effects(t, ev.Key); n != 1 {
					t.Errorf("%s: effects after the retry = %d, want 1", tc.name, n)
				}
			}

			ev := event("evt_wrapper_" + w.name + "_permanent")
			res := mustProcess(t, p, ev, func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
				if err := insertEffect(ctx, tx, ev); err != nil {
					return err
				}
				return txhook.Permanent(errLate)
			}, txhook.OutcomeFailed)
			if !errors.Is(res.Err, errLate) {
				t.Errorf("permanent: Result.Err = %v, want the handler's error", res.Err)
			}
			if n := b.effects(t, ev.Key); n != 0 {
				t.Errorf("permanent: %d effects committed, want none", n)
			}
			if n := b.count(t, "SELECT count(*) FROM txhook_processed_events WHERE event_key = $1 AND status = 'failed'", ev.Key); n != 1 {
				t.Errorf("permanent: %d failed rows, want 1", n)
			}
		})
	}
}

// TestWrapperKeyNotCommittedBeforeHandler: through a database wrapper, while
// a handler runs, its event's key is not committed: another delivery of the
// key is in flight (never a duplicate), and it becomes a duplicate only once
// the handler's writes committed with the key.
func TestWrapperKeyNotCommittedBeforeHandler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, w := range wrappers(b.pool) {
		t.Run(w.name, func(t *testing.T) {
			cfg := w.cfg
			cfg.LockTimeout = 100 * time.Millisecond
			p, err := txhook.NewProcessor(w.db, &cfg)
			if err != nil {
				t.Fatal(err)
			}
			ev := event("evt_wrapper_held_" + w.name)
			first := holdKey(t, p, ev, false)
			if n := b.keyRows(t, ev.Key); n != 0 {
				t.Errorf("the key is visible to other sessions while its handler runs")
			}
			ran := false
			mustProcess(t, p, ev, func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
				ran = true
				return insertEffect(ctx, tx, ev)
			}, txhook.OutcomeInFlight)
			if ran && !cfg.DedupeWithFirstStatement {
				t.Error("a second handler ran while the first held the key")
			}
			if err := first.finish(t); err != nil {
				t.Fatal(err)
			}
			mustProcess(t, p, ev, insertEffect, txhook.OutcomeDuplicate)
			if n := b.effects(t, ev.Key); n != 1 {
				t.Errorf("effects = %d, want the first delivery's only", n)
			}
		})
	}
}

// TestWrapperLeasePhaseTwoFailureLeavesNothing: through a database wrapper,
// a lease-mode phase two that fails after writing commits neither its
// writes nor the done mark; the claim is released and the retry processes
// the event.
func TestWrapperLeasePhaseTwoFailureLeavesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	errLate := errors.New("ledger rejected the entry")
	for _, w := range wrappers(b.pool) {
		t.Run(w.name, func(t *testing.T) {
			p, err := txhook.NewProcessor(w.db, &w.cfg)
			if err != nil {
				t.Fatal(err)
			}
			ev := event("evt_wrapper_lease_" + w.name)
			failing := txhook.LeaseHandler{Lease: time.Hour, Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
				return func(ctx context.Context, tx pgx.Tx) error {
					if err := insertEffect(ctx, tx, ev); err != nil {
						return err
					}
					return errLate
				}, nil
			}}
			if res, err := p.ProcessLease(boundedCtx(t), ev, failing); !errors.Is(err, errLate) {
				t.Fatalf("ProcessLease = %v, %v; want the handler's error", res, err)
			}
			if n := b.effects(t, ev.Key); n != 0 {
				t.Errorf("%d effects committed, want none", n)
			}
			if n := b.count(t, "SELECT count(*) FROM txhook_processed_events WHERE event_key = $1 AND status = 'in_progress'", ev.Key); n != 1 {
				t.Errorf("the event is not in progress after its phase two failed")
			}
			ok := txhook.LeaseHandler{Lease: time.Hour, Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
				return func(ctx context.Context, tx pgx.Tx) error { return insertEffect(ctx, tx, ev) }, nil
			}}
			if res, err := p.ProcessLease(boundedCtx(t), ev, ok); err != nil || res.Outcome != txhook.OutcomeProcessed {
				t.Fatalf("retry = %v, %v; want processed", res, err)
			}
			if n := b.effects(t, ev.Key); n != 1 {
				t.Errorf("effects after the retry = %d, want 1", n)
			}
		})
	}
}
