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

// TestDedupeWithFirstStatementRoundTrips: BEGIN, the dedupe step and the
// handler's first statement share one round trip, for Exec and for a
// QueryRow first; a duplicate rolls that statement back.
func TestDedupeWithFirstStatementRoundTrips(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p, tr := eager(t, b, txhook.Config{})
	twoWrites := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		var key string
		if err := tx.QueryRow(ctx, "INSERT INTO effects (event_key) VALUES ($1) RETURNING event_key", ev.Key).Scan(&key); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'second')", key)
		return err
	}
	tr.Take()
	mustProcess(t, p, event("evt_eager_one"), insertEffect, txhook.OutcomeProcessed)
	wantTrips(t, tr, "new event, one statement", [][]string{{"begin", "LockTimeoutBound", "InsertEvent", insertEffectSQL, "LockTimeoutRestored"}, {"commit"}})

	mustProcess(t, p, event("evt_eager_two"), twoWrites, txhook.OutcomeProcessed)
	wantTrips(t, tr, "new event, QueryRow then Exec", [][]string{
		{"begin", "LockTimeoutBound", "InsertEvent", "insert into effects (event_key) values ($1) returning event_key", "LockTimeoutRestored"},
		{"insert into effects (event_key, note) values ($1, 'second')"},
		{"commit"},
	})

	var seen []error
	recording := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		_, err1 := tx.Exec(ctx, "INSERT INTO effects (event_key) VALUES ($1)", ev.Key)
		_, err2 := tx.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'second')", ev.Key)
		seen = append(seen, err1, err2)
		return nil // a handler that ignores its errors
	}
	mustProcess(t, p, event("evt_eager_two"), recording, txhook.OutcomeDuplicate)
	wantTrips(t, tr, "duplicate", [][]string{{"begin", "LockTimeoutBound", "InsertEvent", insertEffectSQL, "LockTimeoutRestored"}, {"rollback"}})
	for i, err := range seen {
		if !errors.Is(err, txhook.ErrNotNew) {
			t.Errorf("duplicate: statement %d returned %v, want ErrNotNew", i+1, err)
		}
	}
	if n := b.effects(t, "evt_eager_one"); n != 1 {
		t.Errorf("effects of evt_eager_one = %d, want 1", n)
	}
	if n := b.effects(t, "evt_eager_two"); n != 2 {
		t.Errorf("effects of evt_eager_two = %d, want 2 (its two writes, once)", n)
	}
}

// TestDedupeWithFirstStatementHandlerWithoutStatements: a handler that
// sends nothing still gets its key recorded (after it returns), and its
// error is weighed against the dedupe step's answer as without the option.
func TestDedupeWithFirstStatementHandlerWithoutStatements(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p, tr := eager(t, b, txhook.Config{StorePayload: true})
	nothing := func(context.Context, pgx.Tx, txhook.Event) error { return nil }
	bad := func(context.Context, pgx.Tx, txhook.Event) error {
		return txhook.Permanent(errors.New("payload cannot be applied"))
	}
	transient := func(context.Context, pgx.Tx, txhook.Event) error { return errors.New("try again") }
	tr.Take()

	mustProcess(t, p, event("evt_nothing"), nothing, txhook.OutcomeProcessed)
	wantTrips(t, tr, "no statements", [][]string{{"begin", "InsertEvent"}, {"commit"}})
	mustProcess(t, p, event("evt_nothing"), nothing, txhook.OutcomeDuplicate)
	wantTrips(t, tr, "no statements, duplicate", [][]string{{"begin", "InsertEvent"}, {"rollback"}})

	// A permanent error before any statement: recorded as failed for a new
	// key, a duplicate for a committed one.
	mustProcess(t, p, event("evt_bad"), bad, txhook.OutcomeFailed)
	mustProcess(t, p, event("evt_nothing"), bad, txhook.OutcomeDuplicate)
	if n := b.count(t, "SELECT count(*) FROM txhook_processed_events WHERE event_key = 'evt_bad' AND status = 'failed'"); n != 1 {
		t.Errorf("failed rows for evt_bad = %d, want 1", n)
	}
	// Any other error: nothing committed for a new key; a duplicate stays
	// a duplicate.
	if _, err := p.Process(t.Context(), event("evt_transient"), transient); err == nil {
		t.Error("a handler error was not returned")
	}
	if n := b.count(t, "SELECT count(*) FROM txhook_processed_events WHERE event_key = 'evt_transient'"); n != 0 {
		t.Errorf("evt_transient left %d rows", n)
	}
	mustProcess(t, p, event("evt_nothing"), transient, txhook.OutcomeDuplicate)
}

// TestDedupeWithFirstStatementInFlight: a key held by an uncommitted
// delivery is in flight; the handler's first statement gets ErrNotNew and
// nothing of it commits.
func TestDedupeWithFirstStatementInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p, _ := eager(t, b, txhook.Config{LockTimeout: 100 * time.Millisecond})
	ev := event("evt_eager_held")

	holder := holdKey(t, b.processor(t, nil), ev, false)
	var first error
	res := mustProcess(t, p, ev, func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		_, first = tx.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'second delivery')", ev.Key)
		return first
	}, txhook.OutcomeInFlight)
	if err := holder.finish(t); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(first, txhook.ErrNotNew) {
		t.Errorf("first statement returned %v, want ErrNotNew", first)
	}
	if res.RetryAfter <= 0 {
		t.Errorf("RetryAfter = %v, want > 0", res.RetryAfter)
	}
	if n := b.effects(t, ev.Key); n != 1 {
		t.Errorf("effects = %d, want 1 (the holder's)", n)
	}
}

// TestDedupeWithFirstStatementErrors: a failing first statement of a new
// key rolls everything back; a serialization failure in the dedupe step
// (sent with the first statement) is retried, the handler's work applied
// once.
func TestDedupeWithFirstStatementErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	failFirstKeyInsert(t, b, "evt_eager_40001")
	p, _ := eager(t, b, txhook.Config{Tx: &txhook.TxOptions{BaseBackoff: time.Millisecond}})

	_, err := p.Process(t.Context(), event("evt_eager_bad_sql"), func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		_, err := tx.Exec(ctx, "INSERT INTO no_such_table VALUES (1)")
		return err
	})
	if err == nil {
		t.Error("a failing first statement was not reported")
	}
	if n := b.count(t, "SELECT count(*) FROM txhook_processed_events WHERE event_key = 'evt_eager_bad_sql'"); n != 0 {
		t.Errorf("the failed event left %d key rows", n)
	}

	calls := 0
	mustProcess(t, p, event("evt_eager_40001"), func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		calls++
		return insertEffect(ctx, tx, ev)
	}, txhook.OutcomeProcessed)
	if calls != 2 {
		t.Errorf("handler calls = %d, want 2 (the first attempt's statement met the failed dedupe step)", calls)
	}
	if n := b.effects(t, "evt_eager_40001"); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
}

// TestDedupeWithFirstStatementOtherFirstCalls: a first Query is sent after
// the dedupe step, and a Beginner that cannot send BEGIN in a batch still
// sends the dedupe step with the first statement, after its own BEGIN.
func TestDedupeWithFirstStatementOtherFirstCalls(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p, tr := eager(t, b, txhook.Config{})
	tr.Take()
	mustProcess(t, p, event("evt_eager_query"), func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		rows, err := tx.Query(ctx, "SELECT 1")
		if err != nil {
			return err
		}
		rows.Close()
		return insertEffect(ctx, tx, ev)
	}, txhook.OutcomeProcessed)
	wantTrips(t, tr, "Query first", [][]string{{"begin", "InsertEvent"}, {"select 1"}, {insertEffectSQL}, {"commit"}})

	pool, tr2 := pgtrace.Pool(t, b.db.URL)
	wrapped, err := txhook.NewProcessor(beginOnly{pool}, &txhook.Config{DedupeWithFirstStatement: true})
	if err != nil {
		t.Fatal(err)
	}
	mustProcess(t, wrapped, event("evt_eager_wrapped"), insertEffect, txhook.OutcomeProcessed)
	wantTrips(t, tr2, "a Beginner that begins on its own", [][]string{
		{"begin"}, {"LockTimeoutBound", "InsertEvent", insertEffectSQL, "LockTimeoutRestored"}, {"commit"},
	})
}
