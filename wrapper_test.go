package txhook_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/internal/testdb"
)

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
		{"begin only", testdb.OnlyBegins{Pool: pool}, txhook.Config{RecentKeys: -1}},
		{"begin only, dedupe with first statement", testdb.OnlyBegins{Pool: pool}, txhook.Config{RecentKeys: -1, DedupeWithFirstStatement: true}},
		{"with statements", testdb.BeginsAndRuns{Pool: pool}, txhook.Config{RecentKeys: -1}},
	}
}

// TestWrapperPermanentFailureRecorded: through a database wrapper, a
// handler that writes and then fails permanently has the event recorded as
// failed, without its writes. (A failure's rollback through a wrapper is
// internal/engine's TestWrapperBodyFailureLeavesNothing.)
func TestWrapperPermanentFailureRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	errLate := errors.New("downstream row missing")
	for _, w := range wrappers(b.pool) {
		t.Run(w.name, func(t *testing.T) {
			p, err := txhook.NewProcessor(w.db, &w.cfg)
			if err != nil {
				t.Fatal(err)
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
