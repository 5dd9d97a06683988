package txhook_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/internal/pgtrace"
)

// TestProcessTxHandlerSavepointLeftOpen: a handler that leaves a savepoint
// it began open on its error path does not take the place of ProcessTx's
// own: the delivery's key and all the handler's writes roll back, and a
// permanent error is recorded as failed.
func TestProcessTxHandlerSavepointLeftOpen(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, noMemory)
	ctx := t.Context()
	leaveOpen := func(wrap func(error) error) txhook.HandlerFunc {
		return func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
			if _, err := tx.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'outer')", ev.Key); err != nil {
				return err
			}
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'inner')", ev.Key); err != nil {
				return err
			}
			_, err = sp.Exec(ctx, "SELECT 1/0")
			return wrap(err) // sp left open
		}
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	res, err := p.ProcessTx(ctx, tx, event("evt_sp_open"), leaveOpen(func(err error) error { return err }))
	if err == nil {
		t.Fatalf("ProcessTx: %v, nil; want the handler's error", res.Outcome)
	}
	res, err = p.ProcessTx(ctx, tx, event("evt_sp_open_permanent"), leaveOpen(txhook.Permanent))
	if err != nil || res.Outcome != txhook.OutcomeFailed {
		t.Fatalf("ProcessTx with a permanent error: %v, %v; want failed", res.Outcome, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"evt_sp_open", "evt_sp_open_permanent"} {
		if n := b.effects(t, key); n != 0 {
			t.Errorf("%s: %d effects committed, want 0", key, n)
		}
	}
	if n := b.count(t, "SELECT count(*) FROM txhook_processed_events WHERE event_key = 'evt_sp_open'"); n != 0 {
		t.Errorf("evt_sp_open: key committed with the caller's transaction")
	}
	var status string
	if err := b.pool.QueryRow(ctx, "SELECT status FROM txhook_processed_events WHERE event_key = 'evt_sp_open_permanent'").Scan(&status); err != nil || status != "failed" {
		t.Errorf("evt_sp_open_permanent: status %q, %v; want failed", status, err)
	}
	mustProcess(t, p, event("evt_sp_open"), insertEffect, txhook.OutcomeProcessed)
}

// TestNestedRefusedStatementLeavesTxUsable: a nested run whose first
// statement the server cannot prepare, or whose argument pgx cannot encode,
// fails and leaves the caller's transaction usable, with its own work.
func TestNestedRefusedStatementLeavesTxUsable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	cases := []struct {
		name string
		fn   txhook.TxFunc
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
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO effects (event_key) VALUES ($1)", c.name); err != nil {
			t.Fatal(err)
		}
		if err := txhook.RunNestedTx(ctx, tx, c.fn); err == nil {
			t.Errorf("%s: RunNestedTx returned nil", c.name)
		}
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
			t.Errorf("%s: the caller's next statement: %v", c.name, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Errorf("%s: the caller's commit: %v", c.name, err)
		}
		if n := b.effects(t, c.name); n != 1 {
			t.Errorf("%s: %d of the caller's writes committed, want 1", c.name, n)
		}
	}

	// Under ProcessTx, with the dedupe step sent with the handler's first
	// statement.
	p := b.processor(t, &txhook.Config{DedupeWithFirstStatement: true, RecentKeys: -1})
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	res, err := p.ProcessTx(ctx, tx, event("evt_refused"), func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		_, err := tx.Exec(ctx, "INSERT INTO effects (no_such_column) VALUES ($1)", ev.Key)
		return err
	})
	if err == nil {
		t.Errorf("ProcessTx with a statement that cannot be prepared: %v, nil", res.Outcome)
	}
	if res, err := p.ProcessTx(ctx, tx, event("evt_after_refused"), insertEffect); err != nil || res.Outcome != txhook.OutcomeProcessed {
		t.Errorf("next ProcessTx in the caller's transaction: %v, %v; want processed", res.Outcome, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.effects(t, "evt_after_refused"); n != 1 {
		t.Errorf("evt_after_refused: %d effects, want 1", n)
	}
	mustProcess(t, p, event("evt_refused"), insertEffect, txhook.OutcomeProcessed)
}

// TestNestedRollbackWithDeferredOutside: a nested run rolls back while the
// transaction around it has deferred statements queued: those statements
// stay the enclosing transaction's and commit with it.
func TestNestedRollbackWithDeferredOutside(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, noMemory)
	optional := errors.New("optional part failed")
	res, err := p.Process(t.Context(), event("evt_nested_deferred"), func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		later := txhook.Deferred(tx)
		nerr := txhook.RunNestedTx(ctx, tx, func(ctx context.Context, sp pgx.Tx) error {
			if _, err := sp.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'nested')", ev.Key); err != nil {
				return err
			}
			if _, err := later.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'deferred')", ev.Key); err != nil {
				return err
			}
			return optional
		})
		if !errors.Is(nerr, optional) {
			return errors.Join(errors.New("RunNestedTx did not return its function's error"), nerr)
		}
		_, err := tx.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'main')", ev.Key)
		return err
	})
	if err != nil || res.Outcome != txhook.OutcomeProcessed {
		t.Fatalf("Process: %v, %v; want processed", res.Outcome, err)
	}
	for note, want := range map[string]int{"nested": 0, "deferred": 1, "main": 1} {
		if n := b.count(t, "SELECT count(*) FROM effects WHERE note = $1", note); n != want {
			t.Errorf("%s: %d effects, want %d", note, n, want)
		}
	}
}

// TestSavepointRollbackFailureReported: when ProcessTx's savepoint cannot be
// rolled back, its error says that the caller's transaction is not usable,
// not the handler's error alone.
func TestSavepointRollbackFailureReported(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, noMemory)
	ctx := t.Context()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	boom := errors.New("boom")
	_, err = p.ProcessTx(ctx, tx, event("evt_sp_gone"), func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		if err := insertEffect(ctx, tx, ev); err != nil {
			return err
		}
		// The savepoint ProcessTx runs under, released behind its back.
		if _, err := tx.Conn().Exec(ctx, "RELEASE SAVEPOINT txhook_1"); err != nil {
			return err
		}
		return boom
	})
	if err == nil || errors.Is(err, boom) || !strings.Contains(err.Error(), "not usable") {
		t.Errorf("ProcessTx after its savepoint was lost: %v; want an error saying the transaction is not usable", err)
	}
}

// TestRefusedStatementNotSentAgain: a first batch pgx refuses for a
// statement's own argument (it closes the connection) is not sent again on
// another connection.
func TestRefusedStatementNotSentAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p, tr := tracedProcessor(t, b, &txhook.Config{DedupeWithFirstStatement: true, RecentKeys: -1})
	const sql = "select $1::int"
	tr.Take()
	res, err := p.Process(t.Context(), event("evt_unencodable"), func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		_, err := tx.Exec(ctx, sql, make(chan int))
		return err
	})
	if err == nil {
		t.Fatalf("Process with an argument that cannot be encoded: %v, nil", res.Outcome)
	}
	wantTrips(t, tr, "refused first batch", [][]string{{"begin", "LockTimeoutBound", "InsertEvent", sql, "LockTimeoutRestored"}})
}

// Savepoints a handler opens inside each other have names of their own: the
// outer one's rollback undoes its writes although the inner one was left
// open (as with pgx's own savepoints).
func TestHandlerSavepointsInsideEachOther(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, noMemory)
	mustProcess(t, p, event("evt_nested_savepoints"), func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		outer, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := outer.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'outer')", ev.Key); err != nil {
			return err
		}
		inner, err := outer.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := inner.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'inner')", ev.Key); err != nil {
			return err
		}
		if err := outer.Rollback(ctx); err != nil { // inner left open: rolled back with it
			return err
		}
		// The inner savepoint ended with the outer one: its statements
		// are refused, not run in the handler's transaction.
		if _, err := inner.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'late')", ev.Key); err == nil {
			return errors.New("a statement in a savepoint whose enclosing savepoint ended succeeded")
		}
		return nil
	}, txhook.OutcomeProcessed)
	if n := b.effects(t, "evt_nested_savepoints"); n != 0 {
		t.Errorf("effects = %d after the outer savepoint rolled back, want 0", n)
	}
}

// Under DedupeWithFirstStatement, a handler whose first statement opens a
// savepoint that it then rolls back keeps the session's lock_timeout: the
// first step's bound is restored outside the savepoint.
func TestHandlerSavepointKeepsLockTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, &txhook.Config{DedupeWithFirstStatement: true, RecentKeys: -1})
	var before, after string
	if err := b.pool.QueryRow(t.Context(), "SHOW lock_timeout").Scan(&before); err != nil {
		t.Fatal(err)
	}
	mustProcess(t, p, event("evt_savepoint_bound"), func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
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
	}, txhook.OutcomeProcessed)
	if after != before {
		t.Errorf("lock_timeout after the handler's savepoint rolled back = %q, want the session's %q", after, before)
	}
}

// TestDeferredOutsideWhileSavepointOpen: a statement deferred on the
// handler's transaction while a savepoint of it is open belongs to that
// transaction: the savepoint's statements do not carry it, so it commits
// with the transaction whether the savepoint is released or rolled back,
// and it is sent once, after the savepoint has ended.
func TestDeferredOutsideWhileSavepointOpen(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, tr := pgtrace.Pool(t, b.db.URL)
	p, err := txhook.NewProcessor(pool, noMemory)
	if err != nil {
		t.Fatal(err)
	}
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
		if _, err := txhook.Deferred(tx).Exec(ctx, outerSQL, key); err != nil {
			return err
		}
		if _, err := sp.Exec(ctx, last); err != nil {
			return failed
		}
		return nil
	}
	runs := map[string]func(ctx context.Context, tx pgx.Tx, key, last string) error{
		"RunNestedTx": func(ctx context.Context, tx pgx.Tx, key, last string) error {
			return txhook.RunNestedTx(ctx, tx, func(ctx context.Context, sp pgx.Tx) error {
				return nested(ctx, tx, sp, key, last)
			})
		},
		"handler savepoint": func(ctx context.Context, tx pgx.Tx, key, last string) error {
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
			mustProcess(t, p, event(key), func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
				if err := run(ctx, tx, ev.Key, c.last); err != nil && !errors.Is(err, failed) {
					return err
				}
				return nil
			}, txhook.OutcomeProcessed)
			for note, want := range map[string]int{"nested": c.nested, "outer": 1} {
				if n := b.count(t, "SELECT count(*) FROM effects WHERE event_key = $1 AND note = $2", key, note); n != want {
					t.Errorf("%s, nested run sending %q: %d %s effects, want %d", name, c.last, n, note, want)
				}
			}
			wantTrips(t, tr, name+", nested run sending "+c.last, [][]string{
				{"begin", "InsertEvent"}, {"savepoint txhook_1"}, {nestedSQL}, {c.last}, {c.end}, {outerSQL, "commit"},
			})
		}
	}
}
