package txhook_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
)

// TestStatementTimeoutInDedupeIsInFlight: when the session's
// statement_timeout is shorter than LockTimeout, the server cancels the
// dedupe step's wait on a concurrent delivery of the same key with 57014
// before lock_timeout fires. That is the same wait, so the delivery is in
// flight (retry later), not an error.
func TestStatementTimeoutInDedupeIsInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = "150ms"
	short, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(short.Close)

	// The first delivery of each key holds it in an open transaction.
	hold := func(key string) {
		tx, err := b.pool.Begin(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tx.Rollback(context.Background()) })
		if _, err := tx.Exec(t.Context(), `INSERT INTO txhook_processed_events (source, event_key, status, completed_at)
			VALUES ('test', $1, 'done', now())`, key); err != nil {
			t.Fatal(err)
		}
	}
	for _, first := range []bool{false, true} {
		p, err := txhook.NewProcessor(short, &txhook.Config{LockTimeout: 5 * time.Second, RecentKeys: -1, DedupeWithFirstStatement: first})
		if err != nil {
			t.Fatal(err)
		}
		key := "busy-tx"
		if first {
			key = "busy-tx-first"
		}
		hold(key)
		res, err := p.Process(t.Context(), event(key), insertEffect)
		if err != nil || res.Outcome != txhook.OutcomeInFlight {
			t.Errorf("Process (first statement %v) under a short statement_timeout = %v, %v; want in flight", first, res.Outcome, err)
		}
	}

	p, err := txhook.NewProcessor(short, &txhook.Config{LockTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	hold("busy-lease")
	res, err := p.ProcessLease(t.Context(), event("busy-lease"), txhook.LeaseHandler{
		Work: func(context.Context, txhook.Claim, txhook.Event) (txhook.TxFunc, error) {
			t.Error("work ran for a key held by another delivery")
			return nil, nil
		},
	})
	if err != nil || res.Outcome != txhook.OutcomeInFlight {
		t.Errorf("ProcessLease under a short statement_timeout = %v, %v; want in flight", res.Outcome, err)
	}
	if n := b.effects(t, "busy-tx") + b.effects(t, "busy-tx-first"); n != 0 {
		t.Errorf("%d effects written for held keys", n)
	}
}
