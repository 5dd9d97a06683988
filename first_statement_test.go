package txhook_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/internal/pgtrace"
)

const insertEffectSQL = "insert into effects (event_key) values ($1)"

// eager returns a processor with DedupeWithFirstStatement on a traced pool
// of one connection.
func eager(t *testing.T, b *bundle, cfg txhook.Config) (*txhook.Processor, *pgtrace.Recorder) {
	t.Helper()
	pool, tr := pgtrace.Pool(t, b.db.URL)
	cfg.DedupeWithFirstStatement = true
	cfg.RecentKeys = -1 // every duplicate goes to the database
	p, err := txhook.NewProcessor(pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if n := pool.Stat().AcquiredConns(); n != 0 {
			t.Errorf("%d connections still acquired", n)
		}
	})
	return p, tr
}

func wantTrips(t *testing.T, tr *pgtrace.Recorder, what string, want [][]string) {
	t.Helper()
	if got := tr.Take(); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("%s: round trips %q, want %q", what, got, want)
	}
}

// TestDedupeWithFirstStatementPermanentWithoutStatements: under
// DedupeWithFirstStatement a handler that sends nothing and fails
// permanently is recorded as failed for a new key, and answered a duplicate
// for a committed one. (What the engine does for a body without statements
// is internal/engine's TestWithFirstStatementBodyWithoutStatements.)
func TestDedupeWithFirstStatementPermanentWithoutStatements(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p, _ := eager(t, b, txhook.Config{StorePayload: true})
	nothing := func(context.Context, pgx.Tx, txhook.Event) error { return nil }
	bad := func(context.Context, pgx.Tx, txhook.Event) error {
		return txhook.Permanent(errors.New("payload cannot be applied"))
	}
	mustProcess(t, p, event("evt_nothing"), nothing, txhook.OutcomeProcessed)
	mustProcess(t, p, event("evt_bad"), bad, txhook.OutcomeFailed)
	mustProcess(t, p, event("evt_nothing"), bad, txhook.OutcomeDuplicate)
	if n := b.count(t, "SELECT count(*) FROM txhook_processed_events WHERE event_key = 'evt_bad' AND status = 'failed'"); n != 1 {
		t.Errorf("failed rows for evt_bad = %d, want 1", n)
	}
}

// TestDedupeWithFirstStatementInFlightRetryAfter: under
// DedupeWithFirstStatement a key held by an uncommitted delivery is in
// flight with a Retry-After. (That the handler's statement gets ErrNotNew
// and nothing of it commits is internal/engine's
// TestWithFirstStatementInFlight.)
func TestDedupeWithFirstStatementInFlightRetryAfter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p, _ := eager(t, b, txhook.Config{LockTimeout: 100 * time.Millisecond})
	ev := event("evt_eager_held")
	holder := holdKey(t, b.processor(t, nil), ev, false)
	res := mustProcess(t, p, ev, insertEffect, txhook.OutcomeInFlight)
	if err := holder.finish(t); err != nil {
		t.Fatal(err)
	}
	if res.RetryAfter <= 0 {
		t.Errorf("RetryAfter = %v, want > 0", res.RetryAfter)
	}
}
