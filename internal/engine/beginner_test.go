package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook/internal/engine"
	"github.com/txhook/txhook/internal/testdb"
)

// wrappers are the databases of the wrapper tests, each with the delivery
// options that touch the pipelined path (they must change nothing here).
func wrappers(pool *pgxpool.Pool) []struct {
	name string
	db   engine.Beginner
	d    delivery
} {
	return []struct {
		name string
		db   engine.Beginner
		d    delivery
	}{
		{"begin only", testdb.OnlyBegins{Pool: pool}, delivery{}},
		{"begin only, with first statement", testdb.OnlyBegins{Pool: pool}, delivery{withFirst: true}},
		{"with statements", testdb.BeginsAndRuns{Pool: pool}, delivery{}},
	}
}

// TestWrapperBodyFailureLeavesNothing: through a database wrapper, a body
// that fails after writing (an error, a panic, or statements deferred to
// COMMIT) leaves neither its writes nor the first step's key, and the
// retry applies the body.
func TestWrapperBodyFailureLeavesNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	errLate := errors.New("downstream row missing")
	for _, w := range wrappers(e.pool) {
		t.Run(w.name, func(t *testing.T) {
			for _, tc := range []struct {
				name string
				body func(key string) func(ctx context.Context, tx pgx.Tx) error
			}{
				{"error", func(key string) func(ctx context.Context, tx pgx.Tx) error {
					return func(ctx context.Context, tx pgx.Tx) error {
						if err := insertEffect(key)(ctx, tx); err != nil {
							return err
						}
						return errLate
					}
				}},
				{"deferred write then error", func(key string) func(ctx context.Context, tx pgx.Tx) error {
					return func(ctx context.Context, tx pgx.Tx) error {
						if err := insertEffect(key)(ctx, tx); err != nil {
							return err
						}
						if _, err := engine.Deferred(tx).Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'deferred')", key); err != nil {
							return err
						}
						return errLate
					}
				}},
				{"panic", func(key string) func(ctx context.Context, tx pgx.Tx) error {
					return func(ctx context.Context, tx pgx.Tx) error {
						if err := insertEffect(key)(ctx, tx); err != nil {
							return err
						}
						panic(errLate)
					}
				}},
			} {
				key := "evt_wrapper_" + w.name + "_" + tc.name
				func() {
					defer func() {
						if v := recover(); v != nil && v != errLate {
							panic(v)
						}
					}()
					res, err := w.d.run(boundedCtx(t), engine.Begin(w.db), key, tc.body(key))
					if !errors.Is(err, errLate) {
						t.Errorf("%s: run = %v, %v; want the body's error", tc.name, res, err)
					}
				}()
				if n := e.effects(t, key); n != 0 {
					t.Errorf("%s: %d effects committed, want none", tc.name, n)
				}
				if n := e.keyRows(t, key); n != 0 {
					t.Errorf("%s: the key was committed without its body's writes", tc.name)
				}
				w.d.must(t, w.db, key, insertEffect(key), processed)
				if n := e.effects(t, key); n != 1 {
					t.Errorf("%s: effects after the retry = %d, want 1", tc.name, n)
				}
			}
		})
	}
}

// TestWrapperKeyNotCommittedBeforeBody: through a database wrapper, while
// a body runs, the first step's key is not committed: another delivery of
// the key is in flight (never a duplicate), and it becomes a duplicate only
// once the body's writes committed with the key.
func TestWrapperKeyNotCommittedBeforeBody(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, w := range wrappers(e.pool) {
		t.Run(w.name, func(t *testing.T) {
			d := w.d
			d.lockTimeout = 100 * time.Millisecond
			key := "evt_wrapper_held_" + w.name
			first := holdKeyOn(t, w.db, d, key)
			if n := e.keyRows(t, key); n != 0 {
				t.Errorf("the key is visible to other sessions while its body runs")
			}
			ran := false
			d.must(t, w.db, key, func(ctx context.Context, tx pgx.Tx) error {
				ran = true
				return insertEffect(key)(ctx, tx)
			}, inFlight)
			if ran && !d.withFirst {
				t.Error("a second body ran while the first held the key")
			}
			if err := first.finish(t); err != nil {
				t.Fatal(err)
			}
			d.must(t, w.db, key, insertEffect(key), duplicate)
			if n := e.effects(t, key); n != 1 {
				t.Errorf("effects = %d, want the first delivery's only", n)
			}
		})
	}
}
