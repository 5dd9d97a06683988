package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txhook/txhook/internal/engine"
)

// TestDeferredRoundTrips: deferred statements travel with COMMIT or with the
// next statement, never alone, in both orders of the first step, and are
// not sent at all for a duplicate or a failed body.
func TestDeferredRoundTrips(t *testing.T) {
	t.Parallel()
	for _, first := range []bool{false, true} {
		name := "first step first"
		if first {
			name = "first step with first statement"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			pool, tr := e.traced(t)
			d := delivery{withFirst: first}
			trips := func(stepFirst, withFirst [][]string) [][]string {
				if first {
					return withFirst
				}
				return stepFirst
			}
			tr.Take()

			d.must(t, pool, "evt_write_defer", writeThenDefer("evt_write_defer"), processed)
			wantTrips(t, tr, "write, then deferred write", trips(
				[][]string{{"begin", "InsertEvent"}, {insertEffectSQL}, {insertNoteSQL, "commit"}},
				[][]string{{"begin", "InsertEvent", insertEffectSQL}, {insertNoteSQL, "commit"}},
			))

			const key2 = "evt_defer_read"
			d.must(t, pool, key2, func(ctx context.Context, tx pgx.Tx) error {
				if err := deferNote(ctx, tx, key2, "one"); err != nil {
					return err
				}
				if err := deferNote(ctx, tx, key2, "two"); err != nil {
					return err
				}
				var n int
				return tx.QueryRow(ctx, "SELECT count(*) FROM effects WHERE event_key = $1", key2).Scan(&n)
			}, processed)
			const countSQL = "select count(*) from effects where event_key = $1"
			wantTrips(t, tr, "two deferred writes, then a read", trips(
				[][]string{{"begin", "InsertEvent"}, {insertNoteSQL, insertNoteSQL, countSQL}, {"commit"}},
				[][]string{{"begin", "InsertEvent", insertNoteSQL, insertNoteSQL, countSQL}, {"commit"}},
			))

			d.must(t, pool, "evt_only_deferred", func(ctx context.Context, tx pgx.Tx) error {
				return deferNote(ctx, tx, "evt_only_deferred", "only")
			}, processed)
			wantTrips(t, tr, "only a deferred write", trips(
				[][]string{{"begin", "InsertEvent"}, {insertNoteSQL, "commit"}},
				[][]string{{"begin", "InsertEvent", insertNoteSQL, "commit"}},
			))
			// Its duplicate: with the first statement, the deferred write
			// and COMMIT travel with the dedupe step, whose failure makes
			// the server skip them.
			d.must(t, pool, "evt_only_deferred", func(ctx context.Context, tx pgx.Tx) error {
				return deferNote(ctx, tx, "evt_only_deferred", "again")
			}, duplicate)
			wantTrips(t, tr, "only a deferred write, duplicate", trips(
				[][]string{{"begin", "InsertEvent"}, {"rollback"}},
				[][]string{{"begin", "InsertEvent", insertNoteSQL, "commit"}, {"rollback"}},
			))

			for key, want := range map[string]int{"evt_write_defer": 2, "evt_defer_read": 2, "evt_only_deferred": 1} {
				if n := e.effects(t, key); n != want {
					t.Errorf("%s: %d effects, want %d", key, n, want)
				}
			}

			d.must(t, pool, "evt_write_defer", writeThenDefer("evt_write_defer"), duplicate)
			wantTrips(t, tr, "duplicate", trips(
				[][]string{{"begin", "InsertEvent"}, {"rollback"}},
				[][]string{{"begin", "InsertEvent", insertEffectSQL}, {"rollback"}},
			))
			if n := e.effects(t, "evt_write_defer"); n != 2 {
				t.Errorf("duplicate: %d effects, want the first delivery's 2", n)
			}

			if _, err := d.run(t.Context(), engine.Begin(pool), "evt_body_fails", func(ctx context.Context, tx pgx.Tx) error {
				if err := deferNote(ctx, tx, "evt_body_fails", "never sent"); err != nil {
					return err
				}
				return errors.New("body failed")
			}); err == nil {
				t.Fatal("a failing body's run returned no error")
			}
			wantTrips(t, tr, "failing body", [][]string{{"begin", "InsertEvent"}, {"rollback"}})
			if n := e.effects(t, "evt_body_fails"); n != 0 {
				t.Errorf("failing body: %d effects", n)
			}
		})
	}
}

// TestDeferredStatementFails: a deferred statement that fails, at COMMIT or
// before a later statement, fails the run whatever the body returns:
// nothing commits, the error is the statement's (not the body's own, not
// an unknown commit), and the connection goes back to the pool usable.
func TestDeferredStatementFails(t *testing.T) {
	t.Parallel()
	const badSQL = "INSERT INTO no_such_table (x) VALUES ($1)"
	// errOwn marks the body's own error, as the root's Permanent does: the
	// deferred statement's failure must decide, not it.
	errOwn := errors.New("the body's own error")
	cases := map[string]func(key string) func(ctx context.Context, tx pgx.Tx) error{
		"at commit": func(key string) func(ctx context.Context, tx pgx.Tx) error {
			return func(ctx context.Context, tx pgx.Tx) error {
				if err := insertEffect(key)(ctx, tx); err != nil {
					return err
				}
				_, err := engine.Deferred(tx).Exec(ctx, badSQL, 1)
				return err
			}
		},
		"before a later statement": func(key string) func(ctx context.Context, tx pgx.Tx) error {
			return func(ctx context.Context, tx pgx.Tx) error {
				if err := insertEffect(key)(ctx, tx); err != nil {
					return err
				}
				if _, err := engine.Deferred(tx).Exec(ctx, badSQL, 1); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'after')", key); err != nil {
					// What a body may do with an error it cannot fix; the
					// deferred statement's failure must still decide.
					return fmt.Errorf("%w: %w", errOwn, err)
				}
				return nil
			}
		},
		"alone (with the first step and COMMIT, with the first statement)": func(key string) func(ctx context.Context, tx pgx.Tx) error {
			return func(ctx context.Context, tx pgx.Tx) error {
				if err := deferNote(ctx, tx, key, "before"); err != nil {
					return err
				}
				_, err := engine.Deferred(tx).Exec(ctx, badSQL, 1)
				return err
			}
		},
		"with the first statement": func(key string) func(ctx context.Context, tx pgx.Tx) error {
			return func(ctx context.Context, tx pgx.Tx) error {
				if _, err := engine.Deferred(tx).Exec(ctx, badSQL, 1); err != nil {
					return err
				}
				if err := insertEffect(key)(ctx, tx); err != nil {
					return fmt.Errorf("%w: %w", errOwn, err)
				}
				return nil
			}
		},
	}
	for name, body := range cases {
		for _, first := range []bool{false, true} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				e := setup(t)
				d := delivery{withFirst: first}
				const key = "evt_deferred_fails"
				res, err := d.run(t.Context(), engine.Begin(e.pool), key, body(key))
				if pgCode(err) != pgerrcode.UndefinedTable {
					t.Fatalf("first=%v: run = %v, %v; want the deferred statement's 42P01", first, res, err)
				}
				if !strings.Contains(err.Error(), "deferred statement") {
					t.Errorf("first=%v: error %q does not say a deferred statement failed", first, err)
				}
				if errors.Is(err, errOwn) || errors.As(err, new(*engine.CommitUnknownError)) {
					t.Errorf("first=%v: error %v is the body's own or an unknown commit", first, err)
				}
				if n := e.keys(t); n != 0 {
					t.Errorf("first=%v: %d keys recorded", first, n)
				}
				if n := e.effects(t, key); n != 0 {
					t.Errorf("first=%v: %d effects committed", first, n)
				}
				if n := e.pool.Stat().AcquiredConns(); n != 0 {
					t.Errorf("first=%v: %d connections still acquired", first, n)
				}
				// The retry, with a body that defers nothing wrong.
				d.must(t, e.pool, key, writeThenDefer(key), processed)
				if n := e.effects(t, key); n != 2 {
					t.Errorf("first=%v: retry left %d effects, want 2", first, n)
				}
			})
		}
	}
}

// TestDeferredSerializationFailureIsRetried: a deferred statement sent with
// COMMIT that fails with 40001 retries the whole transaction, whose work
// then commits once.
func TestDeferredSerializationFailureIsRetried(t *testing.T) {
	t.Parallel()
	e := setup(t)
	failFirstInsert(t, e, "effects", "NEW.note = 'deferred'")
	const key = "evt_deferred_40001"
	calls := 0
	delivery{withFirst: true}.must(t, e.pool, key, func(ctx context.Context, tx pgx.Tx) error {
		calls++
		return writeThenDefer(key)(ctx, tx)
	}, processed)
	if calls != 2 {
		t.Errorf("body calls = %d, want 2 (the first attempt rolled back)", calls)
	}
	if n := e.effects(t, key); n != 2 {
		t.Errorf("effects = %d, want 2 (one attempt's)", n)
	}
}

// TestDeferredOnEveryTarget: Deferred means the same on every target (Exec
// queues and answers an empty tag, the queued statement is applied before
// the end), and only a transaction the engine did not begin runs it at
// once.
func TestDeferredOnEveryTarget(t *testing.T) {
	t.Parallel()
	e := setup(t)
	queued := func(ctx context.Context, tx pgx.Tx, key string) error {
		tag, err := engine.Deferred(tx).Exec(ctx, "INSERT INTO effects (event_key) VALUES ($1), ($1)", key)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 0 {
			t.Errorf("%s: rows affected = %d, want 0 (queued)", key, tag.RowsAffected())
		}
		return nil
	}
	if err := runTx(t.Context(), e.pool, func(ctx context.Context, tx pgx.Tx) error {
		return queued(ctx, tx, "run-tx")
	}); err != nil {
		t.Fatal(err)
	}
	if err := runTx(t.Context(), e.pool, func(ctx context.Context, tx pgx.Tx) error {
		return runNested(ctx, tx, func(ctx context.Context, tx pgx.Tx) error {
			return queued(ctx, tx, "nested")
		})
	}); err != nil {
		t.Fatal(err)
	}
	tx, err := e.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	tag, err := engine.Deferred(tx).Exec(t.Context(), "INSERT INTO effects (event_key) VALUES ('own'), ('own')")
	if err != nil || tag.RowsAffected() != 2 {
		t.Errorf("own transaction: rows affected = %d, %v; want 2 (run at once)", tag.RowsAffected(), err)
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"run-tx", "nested", "own"} {
		if n := e.effects(t, key); n != 2 {
			t.Errorf("%s: %d effects, want 2", key, n)
		}
	}
}

// TestTransactionUnusableAfterRun: a body that keeps its transaction cannot
// send through it once the run has returned (its connection is back in the
// pool, perhaps in use elsewhere).
func TestTransactionUnusableAfterRun(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, first := range []bool{false, true} {
		var kept pgx.Tx
		key := "evt_kept_" + map[bool]string{false: "a", true: "b"}[first]
		delivery{withFirst: first}.must(t, e.pool, key, func(ctx context.Context, tx pgx.Tx) error {
			kept = tx
			return writeThenDefer(key)(ctx, tx)
		}, processed)
		if _, err := kept.Exec(t.Context(), "INSERT INTO effects (event_key) VALUES ('late')"); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("first=%v: Exec after the run = %v, want ErrTxClosed", first, err)
		}
		if _, err := engine.Deferred(kept).Exec(t.Context(), "INSERT INTO effects (event_key) VALUES ('late')"); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("first=%v: deferred Exec after the run = %v, want ErrTxClosed", first, err)
		}
		if err := kept.QueryRow(t.Context(), "SELECT 1").Scan(new(int)); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("first=%v: QueryRow after the run = %v, want ErrTxClosed", first, err)
		}
	}
	if n := e.effects(t, "late"); n != 0 {
		t.Errorf("%d late effects", n)
	}
}

// TestDeferredNotSentIsNotLost: when the batch carrying deferred statements
// cannot be sent (pgx cannot encode the next statement's argument), the
// deferred statements are not applied, and a body that ignores the error
// must not get its transaction committed without them.
func TestDeferredNotSentIsNotLost(t *testing.T) {
	t.Parallel()
	for _, first := range []bool{false, true} {
		e := setup(t)
		const key = "evt_not_sent"
		res, err := delivery{withFirst: first}.run(t.Context(), engine.Begin(e.pool), key, func(ctx context.Context, tx pgx.Tx) error {
			if err := insertEffect(key)(ctx, tx); err != nil {
				return err
			}
			if err := deferNote(ctx, tx, key, "deferred"); err != nil {
				return err
			}
			_, _ = tx.Exec(ctx, "INSERT INTO effects (event_key) VALUES ($1)", make(chan int))
			return nil // ignores the failed statement
		})
		if err == nil || !strings.Contains(err.Error(), "deferred statement not applied") {
			t.Errorf("first=%v: run = %v, %v; want the deferred statement not applied", first, res, err)
		}
		if n := e.keys(t); n != 0 {
			t.Errorf("first=%v: %d keys committed", first, n)
		}
		if n := e.effects(t, key); n != 0 {
			t.Errorf("first=%v: %d effects committed", first, n)
		}
	}
}

// TestDeferredUnderSavepoint: under a savepoint, as in a transaction, a
// deferred Exec is queued (empty command tag), sent no later than the
// savepoint's release, and a deferred statement that fails fails the run:
// its savepoint rolls back and the caller's transaction stays usable.
func TestDeferredUnderSavepoint(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())

	var tag pgconn.CommandTag
	res, err := delivery{}.run(ctx, engine.Savepoint(tx), "evt_tx_deferred", func(ctx context.Context, tx pgx.Tx) error {
		var err error
		tag, err = engine.Deferred(tx).Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'deferred')", "evt_tx_deferred")
		return err
	})
	if err != nil || res != processed {
		t.Fatalf("run: %v, %v; want processed", res, err)
	}
	if tag.RowsAffected() != 0 || tag.String() != "" {
		t.Errorf("deferred Exec answered %q, want an empty command tag", tag.String())
	}

	res, err = delivery{}.run(ctx, engine.Savepoint(tx), "evt_tx_deferred_fails", func(ctx context.Context, tx pgx.Tx) error {
		if err := insertEffect("evt_tx_deferred_fails")(ctx, tx); err != nil {
			return err
		}
		_, err := engine.Deferred(tx).Exec(ctx, "INSERT INTO no_such_table VALUES (1)")
		return err // nil: the statement is queued
	})
	if err == nil || !errors.As(err, new(*pgconn.PgError)) {
		t.Errorf("run with a failing deferred statement: %v, %v; want the statement's error", res, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("the caller's transaction is not usable after the failed run: %v", err)
	}
	if n := e.effects(t, "evt_tx_deferred"); n != 1 {
		t.Errorf("evt_tx_deferred: %d effects, want 1", n)
	}
	if n := e.effects(t, "evt_tx_deferred_fails"); n != 0 {
		t.Errorf("evt_tx_deferred_fails: %d effects, want 0", n)
	}
	if n := e.keyRows(t, "evt_tx_deferred_fails"); n != 0 {
		t.Errorf("evt_tx_deferred_fails: %d key rows, want 0", n)
	}
}

// TestDeferredNotSentAfterContextEnds: deferred statements are part of the
// body's work. A body whose context has ended by the time it returns gets
// none of its deferred writes sent, and nothing commits, with and without a
// first step.
func TestDeferredNotSentAfterContextEnds(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, first := range []bool{false, true} {
		key := map[bool]string{false: "evt_ctx_a", true: "evt_ctx_b"}[first]
		ctx, cancel := context.WithCancel(t.Context())
		_, err := delivery{withFirst: first}.run(ctx, engine.Begin(e.pool), key, func(ctx context.Context, tx pgx.Tx) error {
			if err := insertEffect(key)(ctx, tx); err != nil {
				return err
			}
			if err := deferNote(ctx, tx, key, "deferred"); err != nil {
				return err
			}
			cancel() // the request ends before the body returns
			return nil
		})
		cancel()
		if !errors.Is(err, context.Canceled) {
			t.Errorf("first=%v: run = %v, want context.Canceled", first, err)
		}
		if n := e.effects(t, key); n != 0 {
			t.Errorf("first=%v: %d effects committed", first, n)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	err := runTx(ctx, e.pool, func(ctx context.Context, tx pgx.Tx) error {
		if err := deferNote(ctx, tx, "run-tx-ctx", "deferred"); err != nil {
			return err
		}
		cancel()
		return nil
	})
	cancel()
	if !errors.Is(err, context.Canceled) {
		t.Errorf("run without a first step = %v, want context.Canceled", err)
	}
	if n := e.effects(t, "run-tx-ctx"); n != 0 {
		t.Errorf("run without a first step: %d effects committed", n)
	}
}
