package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook/internal/engine"
	"github.com/txhook/txhook/internal/testdb"
)

// TestFirstStepSharesRoundTripWithBegin: BEGIN and the first step travel in
// one round trip; a key that is not new rolls back at once.
func TestFirstStepSharesRoundTripWithBegin(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pool, tr := e.traced(t)
	const key = "evt_rt"
	// The first run on a connection also prepares the statements; warm up
	// with another key so that the cases below see the steady state.
	delivery{}.must(t, pool, "evt_warm", insertEffect("evt_warm"), processed)
	tr.Take()

	cases := []struct {
		name string
		want string
		sent [][]string
	}{
		{"new", processed, [][]string{
			{"begin", "InsertEvent"},
			{"insert into effects (event_key) values ($1)"},
			{"commit"},
		}},
		{"duplicate", duplicate, [][]string{
			{"begin", "InsertEvent"},
			{"rollback"},
		}},
	}
	for _, c := range cases {
		delivery{}.must(t, pool, key, insertEffect(key), c.want)
		wantTrips(t, tr, c.name, c.sent)
		if n := pool.Stat().AcquiredConns(); n != 0 {
			t.Errorf("%s: %d connections still acquired", c.name, n)
		}
	}
	if n := e.effects(t, key); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
}

// TestFirstStepSerializationFailureIsRetried makes the first step itself,
// sent with BEGIN, fail with 40001 once: the attempt must roll back and the
// retry apply the body, which runs once.
func TestFirstStepSerializationFailureIsRetried(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const key = "evt_dedupe_40001"
	failFirstKeyInsert(t, e, key)
	calls := 0
	delivery{}.must(t, e.pool, key, func(ctx context.Context, tx pgx.Tx) error {
		calls++
		return insertEffect(key)(ctx, tx)
	}, processed)
	if calls != 1 {
		t.Errorf("body calls = %d, want 1", calls)
	}
	if n := e.count(t, "SELECT last_value::int FROM fail_once"); n != 2 {
		t.Errorf("first steps attempted = %d, want 2", n)
	}
	if n := e.effects(t, key); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
	if n := e.pool.Stat().AcquiredConns(); n != 0 {
		t.Errorf("%d connections still acquired", n)
	}
}

// TestWithFirstStatementRoundTrips: BEGIN, the first step and the body's
// first statement share one round trip, for Exec and for a QueryRow first;
// a duplicate rolls that statement back, and the body's statements return
// ErrNotNew.
func TestWithFirstStatementRoundTrips(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pool, tr := e.traced(t)
	d := delivery{withFirst: true}
	twoWrites := func(key string) func(ctx context.Context, tx pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			var got string
			if err := tx.QueryRow(ctx, "INSERT INTO effects (event_key) VALUES ($1) RETURNING event_key", key).Scan(&got); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'second')", got)
			return err
		}
	}
	tr.Take()
	d.must(t, pool, "evt_eager_one", insertEffect("evt_eager_one"), processed)
	wantTrips(t, tr, "new key, one statement", [][]string{{"begin", "InsertEvent", insertEffectSQL}, {"commit"}})

	d.must(t, pool, "evt_eager_two", twoWrites("evt_eager_two"), processed)
	wantTrips(t, tr, "new key, QueryRow then Exec", [][]string{
		{"begin", "InsertEvent", "insert into effects (event_key) values ($1) returning event_key"},
		{"insert into effects (event_key, note) values ($1, 'second')"},
		{"commit"},
	})

	var seen []error
	recording := func(ctx context.Context, tx pgx.Tx) error {
		_, err1 := tx.Exec(ctx, "INSERT INTO effects (event_key) VALUES ($1)", "evt_eager_two")
		_, err2 := tx.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'second')", "evt_eager_two")
		seen = append(seen, err1, err2)
		return nil // a body that ignores its errors
	}
	d.must(t, pool, "evt_eager_two", recording, duplicate)
	wantTrips(t, tr, "duplicate", [][]string{{"begin", "InsertEvent", insertEffectSQL}, {"rollback"}})
	for i, err := range seen {
		if !errors.Is(err, engine.ErrNotNew) {
			t.Errorf("duplicate: statement %d returned %v, want ErrNotNew", i+1, err)
		}
	}
	if n := e.effects(t, "evt_eager_one"); n != 1 {
		t.Errorf("effects of evt_eager_one = %d, want 1", n)
	}
	if n := e.effects(t, "evt_eager_two"); n != 2 {
		t.Errorf("effects of evt_eager_two = %d, want 2 (its two writes, once)", n)
	}
}

// TestWithFirstStatementBodyWithoutStatements: a body that sends nothing
// still gets the first step sent (after it returns: with COMMIT, in one
// round trip, when the body succeeded), and its error is weighed against
// the first step's answer as without the option.
func TestWithFirstStatementBodyWithoutStatements(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pool, tr := e.traced(t)
	d := delivery{withFirst: true}
	nothing := func(context.Context, pgx.Tx) error { return nil }
	transient := func(context.Context, pgx.Tx) error { return errors.New("try again") }
	tr.Take()

	d.must(t, pool, "evt_nothing", nothing, processed)
	wantTrips(t, tr, "no statements", [][]string{{"begin", "InsertEvent", "commit"}})
	d.must(t, pool, "evt_nothing", nothing, duplicate)
	wantTrips(t, tr, "no statements, duplicate", [][]string{{"begin", "InsertEvent", "commit"}, {"rollback"}})

	// An error: nothing committed for a new key; a duplicate stays a
	// duplicate.
	if _, err := d.run(t.Context(), engine.Begin(pool), "evt_transient", transient); err == nil {
		t.Error("a body error was not returned")
	}
	if n := e.keyRows(t, "evt_transient"); n != 0 {
		t.Errorf("evt_transient left %d rows", n)
	}
	d.must(t, pool, "evt_nothing", transient, duplicate)
}

// TestWithFirstStatementInFlight: a key held by an uncommitted delivery is
// in flight; the body's first statement gets ErrNotNew and nothing of it
// commits.
func TestWithFirstStatementInFlight(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const key = "evt_eager_held"
	holder := holdKey(t, e.pool, key)
	var first error
	delivery{withFirst: true, lockTimeout: 100 * time.Millisecond}.must(t, e.pool, key, func(ctx context.Context, tx pgx.Tx) error {
		_, first = tx.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'second delivery')", key)
		return first
	}, inFlight)
	if err := holder.finish(t); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(first, engine.ErrNotNew) {
		t.Errorf("first statement returned %v, want ErrNotNew", first)
	}
	if n := e.effects(t, key); n != 1 {
		t.Errorf("effects = %d, want 1 (the holder's)", n)
	}
}

// TestWithFirstStatementErrors: a failing first statement of a new key
// rolls everything back; a serialization failure in the first step (sent
// with the first statement) is retried, the body's work applied once.
func TestWithFirstStatementErrors(t *testing.T) {
	t.Parallel()
	e := setup(t)
	failFirstKeyInsert(t, e, "evt_eager_40001")
	d := delivery{withFirst: true}

	_, err := d.run(t.Context(), engine.Begin(e.pool), "evt_eager_bad_sql", func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO no_such_table VALUES (1)")
		return err
	})
	if err == nil {
		t.Error("a failing first statement was not reported")
	}
	if n := e.keyRows(t, "evt_eager_bad_sql"); n != 0 {
		t.Errorf("the failed run left %d key rows", n)
	}

	calls := 0
	d.must(t, e.pool, "evt_eager_40001", func(ctx context.Context, tx pgx.Tx) error {
		calls++
		return insertEffect("evt_eager_40001")(ctx, tx)
	}, processed)
	if calls != 2 {
		t.Errorf("body calls = %d, want 2 (the first attempt's statement met the failed first step)", calls)
	}
	if n := e.effects(t, "evt_eager_40001"); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
}

// TestWithFirstStatementOtherFirstCalls: a first Query is sent after the
// first step, and a Beginner that cannot send BEGIN in a batch still sends
// the first step with the first statement, after its own BEGIN.
func TestWithFirstStatementOtherFirstCalls(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pool, tr := e.traced(t)
	d := delivery{withFirst: true}
	tr.Take()
	d.must(t, pool, "evt_eager_query", func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, "SELECT 1")
		if err != nil {
			return err
		}
		rows.Close()
		return insertEffect("evt_eager_query")(ctx, tx)
	}, processed)
	wantTrips(t, tr, "Query first", [][]string{{"begin", "InsertEvent"}, {"select 1"}, {insertEffectSQL}, {"commit"}})

	pool2, tr2 := e.traced(t)
	d.must(t, testdb.OnlyBegins{Pool: pool2}, "evt_eager_wrapped", insertEffect("evt_eager_wrapped"), processed)
	wantTrips(t, tr2, "a Beginner that begins on its own", [][]string{
		{"begin"}, {"InsertEvent", insertEffectSQL}, {"commit"},
	})
}

// TestRefusedStatementNotSentAgain: a first batch pgx refuses for a
// statement's own argument (it closes the connection) is not sent again on
// another connection.
func TestRefusedStatementNotSentAgain(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pool, tr := e.traced(t)
	const sql = "select $1::int"
	tr.Take()
	res, err := delivery{withFirst: true}.run(t.Context(), engine.Begin(pool), "evt_unencodable", func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, sql, make(chan int))
		return err
	})
	if err == nil {
		t.Fatalf("a run with an argument that cannot be encoded: %v, nil", res)
	}
	wantTrips(t, tr, "refused first batch", [][]string{{"begin", "InsertEvent", sql}})
}

// TestOneRoundTripInFlight: a body that only defers its writes sends them,
// with the first step and COMMIT, in one round trip; when the key is held
// by an uncommitted delivery past the bound, the first step's lock timeout
// makes the server skip them: in flight, nothing committed.
func TestOneRoundTripInFlight(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const key = "evt_one_trip_held"
	holder := holdKey(t, e.pool, key)
	delivery{withFirst: true, lockTimeout: 100 * time.Millisecond}.must(t, e.pool, key, func(ctx context.Context, tx pgx.Tx) error {
		return deferNote(ctx, tx, key, "second delivery")
	}, inFlight)
	if err := holder.finish(t); err != nil {
		t.Fatal(err)
	}
	if n := e.count(t, "SELECT count(*) FROM effects WHERE note = 'second delivery'"); n != 0 {
		t.Errorf("the in-flight delivery's deferred write committed %d times", n)
	}
}

// TestFirstAbortsBroken: a first step declared to abort the transaction
// (Spec.FirstAborts) that stops the run after its statement succeeded
// breaks that promise: COMMIT, sent with it, ran. The run says so, and is
// not taken for the stop it asked for.
func TestFirstAbortsBroken(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const key = "evt_broken_first"
	err := engine.Run(t.Context(), engine.Begin(e.pool), opts, engine.Spec{
		First: func(ctx context.Context, q engine.Querier) error {
			if _, err := q.Exec(ctx, "SELECT 1"); err != nil {
				return err
			}
			return engine.ErrRollback
		},
		WithFirstStatement: true,
		FirstAborts:        true,
		Body: func(ctx context.Context, tx pgx.Tx) error {
			return deferNote(ctx, tx, key, "committed anyway")
		},
	})
	if err == nil || errors.Is(err, engine.ErrRollback) {
		t.Fatalf("run = %v, want an error other than the requested rollback", err)
	}
	if n := e.effects(t, key); n != 1 {
		t.Errorf("effects = %d, want the 1 that COMMIT applied", n)
	}
}
