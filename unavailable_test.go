package txhook_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/internal/testdb"
)

// TestUnavailableDatabase: a database dropped under a warm pool, and a
// closed pool, give ErrUnavailable on every path, never a plain error.
func TestUnavailableDatabase(t *testing.T) {
	t.Parallel()
	lease := txhook.LeaseHandler{Work: func(context.Context, txhook.Claim, txhook.Event) (txhook.TxFunc, error) {
		return nil, nil
	}}
	check := func(t *testing.T, p *txhook.Processor, db txhook.Beginner) {
		t.Helper()
		if _, err := p.Process(t.Context(), event("evt_down"), insertEffect); !errors.Is(err, txhook.ErrUnavailable) {
			t.Errorf("Process: %v, want ErrUnavailable", err)
		}
		if _, err := p.ProcessLease(t.Context(), event("evt_down_lease"), lease); !errors.Is(err, txhook.ErrUnavailable) {
			t.Errorf("ProcessLease: %v, want ErrUnavailable", err)
		}
		err := txhook.Run(t.Context(), db, nil, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "SELECT 1")
			return err
		})
		if !errors.Is(err, txhook.ErrUnavailable) {
			t.Errorf("Run: %v, want ErrUnavailable", err)
		}
	}
	t.Run("dropped database", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pool, err := pgxpool.New(t.Context(), b.db.URL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		p, err := txhook.NewProcessor(pool, noMemory)
		if err != nil {
			t.Fatal(err)
		}
		mustProcess(t, p, event("evt_warm"), insertEffect, txhook.OutcomeProcessed)
		admin, err := pgx.Connect(t.Context(), testdb.ServerURL(t))
		if err != nil {
			t.Fatal(err)
		}
		defer admin.Close(context.Background())
		if _, err := admin.Exec(t.Context(), "DROP DATABASE "+pgx.Identifier{b.db.Name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Fatal(err)
		}
		check(t, p, pool)
	})
	t.Run("closed pool", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pool, err := pgxpool.New(t.Context(), b.db.URL)
		if err != nil {
			t.Fatal(err)
		}
		p, err := txhook.NewProcessor(pool, noMemory)
		if err != nil {
			t.Fatal(err)
		}
		mustProcess(t, p, event("evt_warm"), insertEffect, txhook.OutcomeProcessed)
		pool.Close()
		check(t, p, pool)
	})
}

// TestLeaseAfterSessionsEnded: the server ends the sessions of a warm pool;
// the next lease-mode delivery, whose claim runs outside any transaction,
// succeeds at its first call, with retries of the transaction turned off:
// the claim had not run on the dead connection, so it is sent again on a
// fresh one.
func TestLeaseAfterSessionsEnded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, err := pgxpool.New(t.Context(), b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	p, err := txhook.NewProcessor(pool, &txhook.Config{RecentKeys: -1, Tx: &txhook.TxOptions{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	h := txhook.LeaseHandler{Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
		return func(ctx context.Context, tx pgx.Tx) error { return insertEffect(ctx, tx, ev) }, nil
	}}
	if res, err := p.ProcessLease(t.Context(), event("evt_lease_warm"), h); err != nil || res.Outcome != txhook.OutcomeProcessed {
		t.Fatalf("warm-up: %v, %v", res.Outcome, err)
	}
	testdb.EndSessions(t, b.db.URL)
	if res, err := p.ProcessLease(t.Context(), event("evt_lease_after_end"), h); err != nil || res.Outcome != txhook.OutcomeProcessed {
		t.Fatalf("ProcessLease after the sessions ended: %v, %v; want processed", res.Outcome, err)
	}
}
