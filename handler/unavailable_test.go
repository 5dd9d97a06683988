package handler_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/internal/testdb"
)

// TestUnavailableAnswers503: a closed pool and a database dropped under a
// warm pool are answered 503 with Retry-After (the sender retries later),
// never 500, and so is a route whose own statement met a database that
// cannot be used (the engine's one classification, engine.Unreachable);
// sessions the server ended under a warm pool cost the sender nothing: the
// delivery is applied at once.
func TestUnavailableAnswers503(t *testing.T) {
	t.Parallel()
	stripe := &handler.Stripe{Secrets: []string{"whsec_x"}}
	setupEnv := func(t *testing.T) (*env, *pgxpool.Pool, *testdb.DB) {
		d := testdb.New(t)
		if _, err := d.Pool.Exec(t.Context(), `CREATE TABLE effects (source text, event_key text, event_type text)`); err != nil {
			t.Fatal(err)
		}
		pool, err := pgxpool.New(t.Context(), d.URL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		e := newEnvPool(t, d.Pool, pool, handler.Config{Source: "stripe", Provider: stripe}, nil)
		e.post(stripe, stripeEvent("evt_warm", "invoice.paid")).want(t, 200, "status", "processed")
		return e, pool, d
	}
	want503 := func(t *testing.T, r response) {
		t.Helper()
		r.want(t, 503, "error", "unavailable")
		if r.header.Get("Retry-After") == "" {
			t.Error("503 without Retry-After")
		}
	}
	t.Run("closed pool", func(t *testing.T) {
		t.Parallel()
		e, pool, _ := setupEnv(t)
		pool.Close()
		want503(t, e.post(stripe, stripeEvent("evt_closed", "invoice.paid")))
		e.wantCounts(1, 1)
	})
	t.Run("dropped database", func(t *testing.T) {
		t.Parallel()
		e, _, d := setupEnv(t)
		admin, err := pgx.Connect(t.Context(), testdb.ServerURL(t))
		if err != nil {
			t.Fatal(err)
		}
		defer admin.Close(context.Background())
		if _, err := admin.Exec(t.Context(), "DROP DATABASE "+pgx.Identifier{d.Name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Fatal(err)
		}
		want503(t, e.post(stripe, stripeEvent("evt_dropped", "invoice.paid")))
	})
	t.Run("sessions ended", func(t *testing.T) {
		t.Parallel()
		e, _, d := setupEnv(t)
		admin, err := pgx.Connect(t.Context(), d.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer admin.Close(context.Background())
		if _, err := admin.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()`); err != nil {
			t.Fatal(err)
		}
		e.post(stripe, stripeEvent("evt_after_end", "invoice.paid")).want(t, 200, "status", "processed")
	})
	t.Run("route's own statement", func(t *testing.T) {
		t.Parallel()
		d := testdb.New(t)
		closed, err := pgxpool.New(t.Context(), d.URL)
		if err != nil {
			t.Fatal(err)
		}
		closed.Close()
		// The handler looks something up on a pool of its own, closed.
		own := routesFor("stripe", map[string]txhook.HandlerFunc{"invoice.paid": func(ctx context.Context, _ pgx.Tx, _ txhook.Event) error {
			_, err := closed.Exec(ctx, "SELECT 1")
			return fmt.Errorf("look up account: %w", err)
		}})
		e := newEnvPool(t, d.Pool, d.Pool, handler.Config{Source: "stripe", Provider: stripe}, &txhook.Config{Routes: own})
		want503(t, e.post(stripe, stripeEvent("evt_own", "invoice.paid")))
	})
}
