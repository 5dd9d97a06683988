package engine_test

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook/internal/engine"
	"github.com/txhook/txhook/internal/pgtrace"
	"github.com/txhook/txhook/internal/testdb"
)

// TestConfigSendsNothing: a transaction tells the configuration of the pool
// or connection it runs on, and of its savepoints', without sending what
// it holds back: the deferred statement still travels with the next one.
// A Beginner of another kind tells none.
func TestConfigSendsNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pool, tr := pgtrace.Pool(t, e.db.URL)
	pool2, tr2 := pgtrace.Pool(t, e.db.URL)
	conn := func() *pgx.Conn {
		c, err := pool2.Acquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Release)
		return c.Conn()
	}()
	configured := func(t *testing.T, db engine.Beginner, rec *pgtrace.Recorder, nested bool) {
		trips := [][]string{{"begin", "insert into effects (event_key) values ('deferred')", "select 1"}, {"commit"}}
		if nested {
			trips = [][]string{{"begin"}, {"savepoint txhook_1"}, {"insert into effects (event_key) values ('deferred')", "select 1"}, {"release savepoint txhook_1"}, {"commit"}}
		}
		body := func(ctx context.Context, tx pgx.Tx) error {
			if _, err := engine.Deferred(tx).Exec(ctx, `INSERT INTO effects (event_key) VALUES ('deferred')`); err != nil {
				return err
			}
			c, ok := tx.(interface{ Config() *pgxpool.Config })
			if !ok || c.Config() == nil {
				t.Fatal("the transaction tells no configuration")
			}
			if got := c.Config().ConnConfig.Host; got != pool.Config().ConnConfig.Host {
				t.Errorf("configuration's host %q, want %q", got, pool.Config().ConnConfig.Host)
			}
			_, err := tx.Exec(ctx, `SELECT 1`)
			return err
		}
		rec.Take()
		var err error
		if nested {
			err = engine.Run(t.Context(), engine.Begin(db), opts, engine.Spec{Body: func(ctx context.Context, tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, "SELECT 2"); err != nil {
					return err
				}
				rec.Take()
				return engine.Run(ctx, engine.Savepoint(tx), opts, engine.Spec{Body: body})
			}})
			trips = trips[1:]
		} else {
			err = engine.Run(t.Context(), engine.Begin(db), opts, engine.Spec{Body: body})
		}
		if err != nil {
			t.Fatal(err)
		}
		if got := rec.Take(); !slices.EqualFunc(got, trips, slices.Equal) {
			t.Errorf("round trips %q, want %q", got, trips)
		}
	}
	t.Run("pool", func(t *testing.T) { configured(t, pool, tr, false) })
	t.Run("pooled connection", func(t *testing.T) {
		pc, err := pool.Acquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Release()
		configured(t, pc, tr, false)
	})
	t.Run("connection", func(t *testing.T) { configured(t, conn, tr2, false) })
	t.Run("savepoint", func(t *testing.T) { configured(t, pool, tr, true) })
	t.Run("other beginner", func(t *testing.T) {
		err := engine.Run(t.Context(), engine.Begin(testdb.OnlyBegins{Pool: e.pool}), opts, engine.Spec{
			Body: func(ctx context.Context, tx pgx.Tx) error {
				if c, ok := tx.(interface{ Config() *pgxpool.Config }); ok && c.Config() != nil {
					t.Error("a wrapper's transaction tells a configuration")
				}
				return nil
			}})
		if err != nil {
			t.Fatal(err)
		}
	})
}
