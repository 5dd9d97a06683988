package engine_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook/internal/engine"
)

// TestNestedRefusedStatementLeavesTxUsable: a nested run whose first
// statement the server cannot prepare, or whose argument pgx cannot encode,
// fails and leaves the caller's transaction usable, with its own work.
func TestNestedRefusedStatementLeavesTxUsable(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	cases := []struct {
		name string
		fn   func(ctx context.Context, tx pgx.Tx) error
	}{
		{"cannot prepare", func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "SELECT no_such_column FROM effects")
			return err
		}},
		{"cannot encode", func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "SELECT $1::int", make(chan int))
			return err
		}},
	}
	for _, c := range cases {
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO effects (event_key) VALUES ($1)", c.name); err != nil {
			t.Fatal(err)
		}
		if err := runNested(ctx, tx, c.fn); err == nil {
			t.Errorf("%s: the nested run returned nil", c.name)
		}
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
			t.Errorf("%s: the caller's next statement: %v", c.name, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Errorf("%s: the caller's commit: %v", c.name, err)
		}
		if n := e.effects(t, c.name); n != 1 {
			t.Errorf("%s: %d of the caller's writes committed, want 1", c.name, n)
		}
	}

	// A delivery under a savepoint, with the dedupe step sent with the
	// body's first statement.
	d := delivery{withFirst: true}
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	res, err := d.run(ctx, engine.Savepoint(tx), "evt_refused", func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO effects (no_such_column) VALUES ($1)", "evt_refused")
		return err
	})
	if err == nil {
		t.Errorf("a delivery with a statement that cannot be prepared: %v, nil", res)
	}
	if res, err := d.run(ctx, engine.Savepoint(tx), "evt_after_refused", insertEffect("evt_after_refused")); err != nil || res != processed {
		t.Errorf("next delivery in the caller's transaction: %v, %v; want processed", res, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.effects(t, "evt_after_refused"); n != 1 {
		t.Errorf("evt_after_refused: %d effects, want 1", n)
	}
	d.must(t, e.pool, "evt_refused", insertEffect("evt_refused"), processed)
}

// TestNestedRollbackWithDeferredOutside: a nested run rolls back while the
// transaction around it has deferred statements queued: those statements
// stay the enclosing transaction's and commit with it.
func TestNestedRollbackWithDeferredOutside(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const key = "evt_nested_deferred"
	optional := errors.New("optional part failed")
	delivery{}.must(t, e.pool, key, func(ctx context.Context, tx pgx.Tx) error {
		later := engine.Deferred(tx)
		nerr := runNested(ctx, tx, func(ctx context.Context, sp pgx.Tx) error {
			if _, err := sp.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'nested')", key); err != nil {
				return err
			}
			if _, err := later.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'deferred')", key); err != nil {
				return err
			}
			return optional
		})
		if !errors.Is(nerr, optional) {
			return errors.Join(errors.New("the nested run did not return its body's error"), nerr)
		}
		_, err := tx.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'main')", key)
		return err
	}, processed)
	for note, want := range map[string]int{"nested": 0, "deferred": 1, "main": 1} {
		if n := e.count(t, "SELECT count(*) FROM effects WHERE note = $1", note); n != want {
			t.Errorf("%s: %d effects, want %d", note, n, want)
		}
	}
}

// TestSavepointRollbackFailureReported: when a run's savepoint cannot be
// rolled back, its error says that the caller's transaction is not usable
// (ErrTxUnusable), not the body's error alone.
func TestSavepointRollbackFailureReported(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	boom := errors.New("boom")
	_, err = delivery{}.run(ctx, engine.Savepoint(tx), "evt_sp_gone", func(ctx context.Context, tx pgx.Tx) error {
		if err := insertEffect("evt_sp_gone")(ctx, tx); err != nil {
			return err
		}
		// The savepoint the run is under, released behind its back.
		if _, err := tx.Conn().Exec(ctx, "RELEASE SAVEPOINT txhook_1"); err != nil {
			return err
		}
		return boom
	})
	if err == nil || errors.Is(err, boom) || !strings.Contains(err.Error(), "not usable") || !errors.Is(err, engine.ErrTxUnusable) {
		t.Errorf("a run after its savepoint was lost: %v; want an error saying the transaction is not usable (ErrTxUnusable)", err)
	}
}

// Savepoints a body opens inside each other have names of their own: the
// outer one's rollback undoes its writes although the inner one was left
// open (as with pgx's own savepoints).
func TestHandlerSavepointsInsideEachOther(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const key = "evt_nested_savepoints"
	delivery{}.must(t, e.pool, key, func(ctx context.Context, tx pgx.Tx) error {
		outer, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := outer.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'outer')", key); err != nil {
			return err
		}
		inner, err := outer.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := inner.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'inner')", key); err != nil {
			return err
		}
		if err := outer.Rollback(ctx); err != nil { // inner left open: rolled back with it
			return err
		}
		// The inner savepoint ended with the outer one: its statements
		// are refused, not run in the body's transaction.
		if _, err := inner.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'late')", key); err == nil {
			return errors.New("a statement in a savepoint whose enclosing savepoint ended succeeded")
		}
		return nil
	}, processed)
	if n := e.effects(t, key); n != 0 {
		t.Errorf("effects = %d after the outer savepoint rolled back, want 0", n)
	}
}

// Under WithFirstStatement, a body whose first statement opens a savepoint
// that it then rolls back keeps the session's lock_timeout: the dedupe
// step restored it before the savepoint opened.
func TestHandlerSavepointKeepsLockTimeout(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var before, after string
	if err := e.pool.QueryRow(t.Context(), "SHOW lock_timeout").Scan(&before); err != nil {
		t.Fatal(err)
	}
	delivery{withFirst: true}.must(t, e.pool, "evt_savepoint_bound", func(ctx context.Context, tx pgx.Tx) error {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := sp.Exec(ctx, "SELECT 1/0"); err == nil {
			return errors.New("division by zero succeeded")
		}
		if err := sp.Rollback(ctx); err != nil {
			return err
		}
		return tx.QueryRow(ctx, "SHOW lock_timeout").Scan(&after)
	}, processed)
	if after != before {
		t.Errorf("lock_timeout after the body's savepoint rolled back = %q, want the session's %q", after, before)
	}
}

// TestDeferredOutsideWhileSavepointOpen: a statement deferred on the body's
// transaction while a savepoint of it is open belongs to that transaction:
// the savepoint's statements do not carry it, so it commits with the
// transaction whether the savepoint is released or rolled back, and it is
// sent once, after the savepoint has ended.
func TestDeferredOutsideWhileSavepointOpen(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pool, tr := e.traced(t)
	const (
		nestedSQL = "insert into effects (event_key, note) values ($1, 'nested')"
		outerSQL  = "insert into effects (event_key, note) values ($1, 'outer')"
	)
	failed := errors.New("nested part failed")
	// nested inserts in sp, defers an insert on tx, then sends last.
	nested := func(ctx context.Context, tx, sp pgx.Tx, key, last string) error {
		if _, err := sp.Exec(ctx, nestedSQL, key); err != nil {
			return err
		}
		if _, err := engine.Deferred(tx).Exec(ctx, outerSQL, key); err != nil {
			return err
		}
		if _, err := sp.Exec(ctx, last); err != nil {
			return failed
		}
		return nil
	}
	runs := map[string]func(ctx context.Context, tx pgx.Tx, key, last string) error{
		"nested run": func(ctx context.Context, tx pgx.Tx, key, last string) error {
			return runNested(ctx, tx, func(ctx context.Context, sp pgx.Tx) error {
				return nested(ctx, tx, sp, key, last)
			})
		},
		"body savepoint": func(ctx context.Context, tx pgx.Tx, key, last string) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if err := nested(ctx, tx, sp, key, last); err != nil {
				if rerr := sp.Rollback(ctx); rerr != nil {
					return rerr
				}
				return err
			}
			return sp.Commit(ctx)
		},
	}
	for name, run := range runs {
		for _, c := range []struct {
			last, end string
			nested    int
		}{
			{"select 1 / 0", "rollback to savepoint txhook_1; release savepoint txhook_1", 0},
			{"select 1", "release savepoint txhook_1", 1},
		} {
			key := "evt_" + strings.ReplaceAll(name, " ", "_") + "_" + strings.ReplaceAll(c.last, " ", "")
			tr.Take()
			delivery{}.must(t, pool, key, func(ctx context.Context, tx pgx.Tx) error {
				if err := run(ctx, tx, key, c.last); err != nil && !errors.Is(err, failed) {
					return err
				}
				return nil
			}, processed)
			for note, want := range map[string]int{"nested": c.nested, "outer": 1} {
				if n := e.count(t, "SELECT count(*) FROM effects WHERE event_key = $1 AND note = $2", key, note); n != want {
					t.Errorf("%s, nested run sending %q: %d %s effects, want %d", name, c.last, n, note, want)
				}
			}
			wantTrips(t, tr, name+", nested run sending "+c.last, [][]string{
				{"begin", "InsertEvent"}, {"savepoint txhook_1"}, {nestedSQL}, {c.last}, {c.end}, {outerSQL, "commit"},
			})
		}
	}
}
