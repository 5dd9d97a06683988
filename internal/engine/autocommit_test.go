package engine_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook/internal/engine"
	"github.com/txhook/txhook/internal/testdb"
)

// insertOne is an Autocommit statement: one effect for key.
func insertOne(key string) func(ctx context.Context, q engine.Querier) error {
	return func(ctx context.Context, q engine.Querier) error {
		_, err := q.Exec(ctx, "INSERT INTO effects (event_key) VALUES ($1)", key)
		return err
	}
}

// TestAutocommitOnEveryDatabase: a statement outside any transaction costs
// one round trip on a pool, a connection and a wrapper that runs
// statements, and runs in a transaction of its own on a wrapper that only
// begins them; it commits in every case.
func TestAutocommitOnEveryDatabase(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pool, tr := e.traced(t)
	pc, err := pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	single := [][]string{{insertEffectSQL}}
	for _, c := range []struct {
		name string
		db   engine.Beginner
		want [][]string
	}{
		{"pgxpool.Conn", pc, single},
		{"pgx.Conn", pc.Conn(), single},
	} {
		tr.Take()
		if err := engine.Autocommit(t.Context(), c.db, opts, insertOne(c.name)); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		wantTrips(t, tr, c.name, c.want)
	}
	pc.Release()
	for _, c := range []struct {
		name string
		db   engine.Beginner
		want [][]string
	}{
		{"pool", pool, single},
		{"with statements", testdb.BeginsAndRuns{Pool: pool}, single},
		{"begin only", testdb.OnlyBegins{Pool: pool}, [][]string{{"begin"}, {insertEffectSQL}, {"commit"}}},
	} {
		tr.Take()
		if err := engine.Autocommit(t.Context(), c.db, opts, insertOne(c.name)); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		wantTrips(t, tr, c.name, c.want)
	}
	for _, key := range []string{"pgxpool.Conn", "pgx.Conn", "pool", "with statements", "begin only"} {
		if n := e.effects(t, key); n != 1 {
			t.Errorf("%s: %d effects, want 1", key, n)
		}
	}
}

// TestAutocommitReplacesEndedConnection: the server ends the sessions of a
// warm pool; the next statement outside a transaction succeeds at its first
// call, applied once: the server had ended the session before the
// statement ran, so it is sent again on a fresh connection.
func TestAutocommitReplacesEndedConnection(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pool := e.ownPool(t)
	if err := engine.Autocommit(t.Context(), pool, opts, insertOne("warm")); err != nil {
		t.Fatal(err)
	}
	testdb.EndSessions(t, e.db.URL)
	if err := engine.Autocommit(t.Context(), pool, opts, insertOne("after-end")); err != nil {
		t.Fatalf("a statement after the sessions ended: %v", err)
	}
	conn, err := pgx.Connect(t.Context(), e.db.URL) // the test's own pool was ended too
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM effects WHERE event_key = 'after-end'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("%d effects, want 1", n)
	}
}

// TestUnavailable: a database dropped under a warm pool, and a closed pool,
// give ErrUnavailable for a run, with and without a first step, and for a
// statement outside a transaction; a statement's own error is not one.
func TestUnavailable(t *testing.T) {
	t.Parallel()
	check := func(t *testing.T, pool *pgxpool.Pool) {
		t.Helper()
		if _, err := (delivery{}).run(t.Context(), engine.Begin(pool), "evt_down", insertEffect("evt_down")); !errors.Is(err, engine.ErrUnavailable) {
			t.Errorf("a delivery: %v, want ErrUnavailable", err)
		}
		if err := runTx(t.Context(), pool, insertEffect("run-tx")); !errors.Is(err, engine.ErrUnavailable) {
			t.Errorf("a run: %v, want ErrUnavailable", err)
		}
		if err := engine.Autocommit(t.Context(), pool, opts, insertOne("autocommit")); !errors.Is(err, engine.ErrUnavailable) {
			t.Errorf("a statement: %v, want ErrUnavailable", err)
		}
	}
	t.Run("statement error", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		err := engine.Autocommit(t.Context(), e.pool, opts, func(ctx context.Context, q engine.Querier) error {
			_, err := q.Exec(ctx, "INSERT INTO no_such_table VALUES (1)")
			return err
		})
		if pgCode(err) != pgerrcode.UndefinedTable || errors.Is(err, engine.ErrUnavailable) {
			t.Errorf("a statement's own error: %v, want its 42P01, not unavailable", err)
		}
	})
	t.Run("dropped database", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		pool := e.ownPool(t)
		delivery{}.must(t, pool, "evt_warm", insertEffect("evt_warm"), processed)
		admin, err := pgx.Connect(t.Context(), testdb.ServerURL(t))
		if err != nil {
			t.Fatal(err)
		}
		defer admin.Close(context.Background())
		if _, err := admin.Exec(t.Context(), "DROP DATABASE "+pgx.Identifier{e.db.Name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Fatal(err)
		}
		check(t, pool)
	})
	t.Run("closed pool", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		pool := e.ownPool(t)
		delivery{}.must(t, pool, "evt_warm", insertEffect("evt_warm"), processed)
		pool.Close()
		check(t, pool)
	})
}
