package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook/internal/engine"
	"github.com/txhook/txhook/internal/testdb"
)

// endThenWrite is a body that ends its transaction with end sent as SQL
// (ROLLBACK or COMMIT), then writes an effect, through the transaction or
// deferred, and ignores its errors (the end's own is the engine's refusal
// when it travelled in the first batch); it records the write's error in
// werr.
func endThenWrite(end, key string, deferred bool, werr *error) func(ctx context.Context, tx pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, _ = tx.Exec(ctx, end)
		if deferred {
			*werr = deferNote(ctx, tx, key, "after "+end)
		} else {
			_, *werr = tx.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, $2)", key, "after "+end)
		}
		return nil
	}
}

// TestBodyEndingItsTransaction: a body that ends the run's transaction with
// a ROLLBACK or COMMIT of its own, then writes, never gets its run
// committed: the write is refused (it would commit on its own, outside any
// transaction), the run fails, and the connection goes back idle. On every
// strategy, with the first step before the body or with its first
// statement, and with the write deferred.
func TestBodyEndingItsTransaction(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, db := range []struct {
		name string
		db   engine.Beginner
	}{{"pool", e.pool}, {"begin only", testdb.OnlyBegins{Pool: e.pool}}} {
		for _, end := range []string{"ROLLBACK", "COMMIT"} {
			for _, first := range []bool{false, true} {
				for _, deferred := range []bool{false, true} {
					name := fmt.Sprintf("%s/%s/first=%v/deferred=%v", db.name, end, first, deferred)
					key := "evt_" + strings.NewReplacer("/", "_", " ", "_", "=", "_").Replace(name)
					var werr error
					res, err := delivery{withFirst: first}.run(boundedCtx(t), engine.Begin(db.db), key, endThenWrite(end, key, deferred, &werr))
					if err == nil {
						t.Errorf("%s: run = %v, nil; want an error", name, res)
					}
					if werr == nil || !strings.Contains(werr.Error(), "ended its transaction") {
						t.Errorf("%s: the write after %s = %v, want it refused", name, end, werr)
					}
					if errors.Is(err, engine.ErrTxUnusable) {
						t.Errorf("%s: %v says a caller's transaction is unusable; the run's own ended", name, err)
					}
					if n := e.effects(t, key); n != 0 {
						t.Errorf("%s: %d effects committed", name, n)
					}
				}
			}
		}
	}
	if n := e.pool.Stat().AcquiredConns(); n != 0 {
		t.Errorf("%d connections still acquired", n)
	}
	delivery{}.must(t, e.pool, "evt_after_all", insertEffect("evt_after_all"), processed)
}

// TestBodyEndingItsTransactionAlone: a body that only ends the transaction
// with ROLLBACK, sending nothing after it, fails the run: the first step's
// key it rolled back is not reported committed.
func TestBodyEndingItsTransactionAlone(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, first := range []bool{false, true} {
		key := fmt.Sprintf("evt_rollback_alone_%v", first)
		res, err := delivery{withFirst: first}.run(t.Context(), engine.Begin(e.pool), key, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "ROLLBACK")
			return err
		})
		if err == nil {
			t.Errorf("first=%v: run = %v, nil; want an error", first, res)
		}
		if n := e.keyRows(t, key); n != 0 {
			t.Errorf("first=%v: %d key rows", first, n)
		}
	}
}

// TestBodyEndingCallersTransaction: under a savepoint, a body's ROLLBACK or
// COMMIT ends the caller's transaction: the run's error matches
// ErrTxUnusable, and the body's later write is refused. A savepoint the
// body began inside a run's own transaction ends that transaction, not a
// caller's.
func TestBodyEndingCallersTransaction(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	for _, end := range []string{"ROLLBACK", "COMMIT"} {
		for _, first := range []bool{false, true} {
			name := fmt.Sprintf("%s/first=%v", end, first)
			key := fmt.Sprintf("evt_caller_%s_%v", end, first)
			tx, err := e.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var werr error
			_, err = delivery{withFirst: first}.run(ctx, engine.Savepoint(tx), key, endThenWrite(end, key, false, &werr))
			if !errors.Is(err, engine.ErrTxUnusable) {
				t.Errorf("%s: run = %v, want ErrTxUnusable", name, err)
			}
			if werr == nil {
				t.Errorf("%s: the write after %s succeeded", name, end)
			}
			_ = tx.Rollback(context.Background())
			if n := e.effects(t, key); n != 0 {
				t.Errorf("%s: %d effects committed", name, n)
			}
		}
	}

	const key = "evt_body_savepoint_ends"
	var werr error
	_, err := delivery{}.run(ctx, engine.Begin(e.pool), key, func(ctx context.Context, tx pgx.Tx) error {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		return endThenWrite("ROLLBACK", key, false, &werr)(ctx, sp)
	})
	if err == nil || errors.Is(err, engine.ErrTxUnusable) {
		t.Errorf("a body's savepoint ending the run's transaction: %v, want the run's own failure", err)
	}
	if werr == nil {
		t.Error("the write after ROLLBACK in the body's savepoint succeeded")
	}
	if n := e.effects(t, key); n != 0 {
		t.Errorf("%d effects committed", n)
	}
}

// TestRowsOfFirstBatchOpenIsNotEnded: while the rows of a first Query
// (travelling with BEGIN) are still being read, the connection has not
// reported the transaction yet: a statement sent then gets pgx's own
// answer, not the ended transaction's, and the run commits.
func TestRowsOfFirstBatchOpenIsNotEnded(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var busy error
	err := runTx(t.Context(), e.pool, func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, "SELECT g FROM generate_series(1, 2) g")
		if err != nil {
			return err
		}
		_, busy = tx.Exec(ctx, "SELECT 1")
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		return insertEffect("rows-open")(ctx, tx)
	})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if busy == nil || strings.Contains(busy.Error(), "ended its transaction") {
		t.Errorf("a statement while the first batch's rows are open: %v, want pgx's busy connection", busy)
	}
	if n := e.effects(t, "rows-open"); n != 1 {
		t.Errorf("%d effects, want 1", n)
	}
}
