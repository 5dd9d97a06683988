package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook/internal/engine"
	"github.com/txhook/txhook/internal/testdb"
)

// TestRunOnOneConnection runs every outcome on a *pgx.Conn and on a
// *pgxpool.Conn: the pipelined BEGIN must leave the connection outside any
// transaction whatever happened.
func TestRunOnOneConnection(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pc, err := e.pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Release()
	conn, err := pgx.Connect(t.Context(), e.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())

	for _, c := range []struct {
		name string
		db   engine.Beginner
		pg   *pgx.Conn
	}{{"pgx.Conn", conn, conn}, {"pgxpool.Conn", pc, pc.Conn()}} {
		t.Run(c.name, func(t *testing.T) {
			d := delivery{lockTimeout: 50 * time.Millisecond}
			idle := func(step string) {
				t.Helper()
				if s := c.pg.PgConn().TxStatus(); s != 'I' {
					t.Fatalf("%s: connection transaction status %q, want idle", step, s)
				}
			}
			key := "evt_one_" + c.name
			if _, err := d.run(t.Context(), engine.Begin(c.db), key, func(ctx context.Context, tx pgx.Tx) error {
				if err := insertEffect(key)(ctx, tx); err != nil {
					return err
				}
				return errors.New("body failed")
			}); err == nil {
				t.Fatal("body error not returned")
			}
			idle("body error")
			d.must(t, c.db, key, insertEffect(key), processed)
			idle("processed")
			d.must(t, c.db, key, insertEffect(key), duplicate)
			idle("duplicate")

			// A delivery on the pool holds a key: in flight.
			held := "evt_held_" + c.name
			first := holdKey(t, e.pool, held)
			d.must(t, c.db, held, insertEffect(held), inFlight)
			idle("in flight")
			if err := first.finish(t); err != nil {
				t.Fatal(err)
			}
			if n := e.effects(t, key); n != 1 {
				t.Errorf("effects = %d, want 1", n)
			}
		})
	}
}

// TestDeadPooledConnection ends the server side of every pooled connection:
// the pipelined BEGIN meets a dead connection, which must not be handed back
// to the pool, and the body must still be applied once.
func TestDeadPooledConnection(t *testing.T) {
	t.Parallel()
	e := setup(t)
	d := delivery{}
	d.must(t, e.pool, "evt_before", insertEffect("evt_before"), processed)
	testdb.EndSessions(t, e.db.URL)
	const key = "evt_after"
	applied := 0
	for attempt := 1; attempt <= 5 && applied == 0; attempt++ {
		res, err := d.run(t.Context(), engine.Begin(e.pool), key, insertEffect(key))
		switch {
		case err != nil:
			t.Logf("attempt %d: %v", attempt, err)
		case res == processed:
			applied = attempt
		default:
			t.Fatalf("attempt %d: outcome %v", attempt, res)
		}
	}
	if applied == 0 {
		t.Fatal("body not applied after the connections died")
	}
	d.must(t, e.pool, key, insertEffect(key), duplicate)
	if n := e.effects(t, key); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
	if n := e.pool.Stat().AcquiredConns(); n != 0 {
		t.Errorf("%d connections still acquired", n)
	}
}

// TestEndedPooledConnectionIsReplaced: the server ends the sessions of a
// warm pool (a restart, pg_terminate_backend, a failover). The next run,
// with or without a first step, succeeds at its first attempt, with retries
// turned off: nothing of it had been sent on the dead connection, so it is
// sent again on a fresh one.
func TestEndedPooledConnectionIsReplaced(t *testing.T) {
	t.Parallel()
	once := opts
	once.MaxAttempts = 1
	for _, first := range []bool{false, true} {
		t.Run(fmt.Sprintf("WithFirstStatement=%v", first), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			pool := e.ownPool(t)
			d := delivery{withFirst: first, opts: &once}
			d.must(t, pool, "evt_warm", insertEffect("evt_warm"), processed)
			testdb.EndSessions(t, e.db.URL)
			d.must(t, pool, "evt_after_end", insertEffect("evt_after_end"), processed)

			d.must(t, pool, "evt_warm_again", insertEffect("evt_warm_again"), processed)
			testdb.EndSessions(t, e.db.URL)
			err := engine.Run(t.Context(), engine.Begin(pool), once, engine.Spec{Body: insertEffect("run-tx")})
			if err != nil {
				t.Fatalf("a run without a first step after the sessions ended: %v", err)
			}
			conn, err := pgx.Connect(t.Context(), e.db.URL) // the test's own pool was ended too
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			for _, key := range []string{"evt_after_end", "run-tx"} {
				var n int
				if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM effects WHERE event_key = $1", key).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n != 1 {
					t.Errorf("%s: %d effects, want 1", key, n)
				}
			}
			if n := pool.Stat().AcquiredConns(); n != 0 {
				t.Errorf("%d connections still acquired", n)
			}
		})
	}
}

// TestQueryFirstTravelsWithBegin: a multi-row Query as a transaction's first
// statement travels with BEGIN (or SAVEPOINT) and what was deferred before
// it, its rows read from that batch; a failed query or deferred statement
// rolls back and leaves the connection idle.
func TestQueryFirstTravelsWithBegin(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pool, tr := e.traced(t)
	ctx := t.Context()
	const two = "select g from generate_series(1, 2) g"
	sum := func(ctx context.Context, tx pgx.Tx, sql string) (int, error) {
		rows, err := tx.Query(ctx, sql)
		if err != nil {
			return 0, err
		}
		n := 0
		for rows.Next() {
			var v int
			if err := rows.Scan(&v); err != nil {
				return 0, err
			}
			n += v
		}
		return n, rows.Err()
	}
	// Warm up: the first use of a statement on a connection prepares it.
	if err := runTx(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
		_, err := sum(ctx, tx, two)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	tr.Take()

	err := runTx(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
		if n, err := sum(ctx, tx, two); err != nil || n != 3 {
			return fmt.Errorf("sum = %d, %v; want 3", n, err)
		}
		return insertEffect("q-1")(ctx, tx)
	})
	if err != nil {
		t.Fatal(err)
	}
	wantTrips(t, tr, "Query first", [][]string{{"begin", two}, {insertEffectSQL}, {"commit"}})

	err = runTx(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := engine.Deferred(tx).Exec(ctx, insertEffectSQL, "q-2"); err != nil {
			return err
		}
		_, err := sum(ctx, tx, two)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	wantTrips(t, tr, "deferred, then Query first", [][]string{{"begin", insertEffectSQL, two}, {"commit"}})

	err = runTx(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
		for _, sql := range []string{insertEffectSQL, "select 1 / 0"} {
			args := []any{"q-3"}[:strings.Count(sql, "$")]
			if _, err := engine.Deferred(tx).Exec(ctx, sql, args...); err != nil {
				return err
			}
		}
		_, _ = sum(ctx, tx, two)
		return nil // a failed deferred statement fails the run whatever the body returns
	})
	if pgCode(err) != pgerrcode.DivisionByZero {
		t.Fatalf("a deferred statement failing before the query: %v, want its division by zero", err)
	}
	wantTrips(t, tr, "failed deferred statement", [][]string{{"begin", insertEffectSQL, "select 1 / 0", two}, {"rollback"}})

	if err := runTx(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
		_, err := sum(ctx, tx, "select 1 / (g - 2) from generate_series(1, 2) g")
		return err
	}); err == nil {
		t.Fatal("a failing query committed")
	}
	tr.Take()
	if n := e.count(t, `SELECT count(*) FROM effects`); n != 2 {
		t.Errorf("%d effects, want 2 (q-1 and q-2; q-3 rolled back)", n)
	}

	// Under a savepoint of the caller's transaction.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	tr.Take()
	if err := runNested(ctx, tx, func(ctx context.Context, tx pgx.Tx) error {
		_, err := sum(ctx, tx, two)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	wantTrips(t, tr, "Query first under a savepoint", [][]string{{"savepoint txhook_1"}, {two}, {"release savepoint txhook_1"}})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Errorf("%d connections still acquired", n)
	}
}
