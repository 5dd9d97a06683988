package txhook_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/internal/pgtrace"
)

// tracedProcessor returns a processor configured by cfg on a traced pool of
// one connection (see pgtrace.Pool).
func tracedProcessor(t *testing.T, b *bundle, cfg *txhook.Config) (*txhook.Processor, *pgtrace.Recorder) {
	t.Helper()
	pool, tr := pgtrace.Pool(t, b.db.URL)
	p, err := txhook.NewProcessor(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p, tr
}

func TestDedupeStepSharesRoundTripWithBegin(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, tr := pgtrace.Pool(t, b.db.URL)
	p, err := txhook.NewProcessor(pool, noMemory)
	if err != nil {
		t.Fatal(err)
	}
	ev := event("evt_rt")
	// The first call on a connection also prepares the statements; warm up
	// with another key so that the cases below see the steady state.
	mustProcess(t, p, event("evt_warm"), insertEffect, txhook.OutcomeProcessed)
	tr.Take()

	cases := []struct {
		name string
		want txhook.Outcome
		sent [][]string
	}{
		{"new", txhook.OutcomeProcessed, [][]string{
			{"begin", "InsertEvent"},
			{"insert into effects (event_key) values ($1)"},
			{"commit"},
		}},
		{"duplicate", txhook.OutcomeDuplicate, [][]string{
			{"begin", "InsertEvent"},
			{"rollback"},
		}},
	}
	for _, c := range cases {
		mustProcess(t, p, ev, insertEffect, c.want)
		if got := tr.Take(); !slices.EqualFunc(got, c.sent, slices.Equal) {
			t.Errorf("%s: round trips %q, want %q", c.name, got, c.sent)
		}
		if n := pool.Stat().AcquiredConns(); n != 0 {
			t.Errorf("%s: %d connections still acquired", c.name, n)
		}
	}
	if n := b.effects(t, ev.Key); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
}

// TestProcessOnOneConnection runs every outcome on a *pgx.Conn and on a
// *pgxpool.Conn: the pipelined BEGIN must leave the connection outside any
// transaction whatever happened.
func TestProcessOnOneConnection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pc, err := b.pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Release()
	conn, err := pgx.Connect(t.Context(), b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())

	for _, c := range []struct {
		name string
		db   txhook.Beginner
		pg   *pgx.Conn
	}{{"pgx.Conn", conn, conn}, {"pgxpool.Conn", pc, pc.Conn()}} {
		t.Run(c.name, func(t *testing.T) {
			p, err := txhook.NewProcessor(c.db, &txhook.Config{LockTimeout: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			idle := func(step string) {
				t.Helper()
				if s := c.pg.PgConn().TxStatus(); s != 'I' {
					t.Fatalf("%s: connection transaction status %q, want idle", step, s)
				}
			}
			ev := event("evt_one_" + c.name)
			if _, err := p.Process(t.Context(), ev, func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
				if err := insertEffect(ctx, tx, ev); err != nil {
					return err
				}
				return errors.New("handler failed")
			}); err == nil {
				t.Fatal("handler error not returned")
			}
			idle("handler error")
			mustProcess(t, p, ev, insertEffect, txhook.OutcomeProcessed)
			idle("processed")
			mustProcess(t, p, ev, insertEffect, txhook.OutcomeDuplicate)
			idle("duplicate")

			// A delivery on the other processor holds a key: in flight.
			held := event("evt_held_" + c.name)
			first := holdKey(t, b.processor(t, nil), held, false)
			mustProcess(t, p, held, insertEffect, txhook.OutcomeInFlight)
			idle("in flight")
			if err := first.finish(t); err != nil {
				t.Fatal(err)
			}
			if n := b.effects(t, ev.Key); n != 1 {
				t.Errorf("effects = %d, want 1", n)
			}
		})
	}
}

// failFirstKeyInsert makes the first insert of key into the events table
// fail with a serialization failure (40001).
func failFirstKeyInsert(t *testing.T, b *bundle, key string) {
	t.Helper()
	failFirstInsert(t, b, "txhook_processed_events", "NEW.event_key = '"+key+"'")
}

// failFirstInsert makes the first insert into table of a row meeting cond
// (SQL over NEW) fail with a serialization failure (40001); the sequence
// fail_once counts the attempts (nextval is not rolled back).
func failFirstInsert(t *testing.T, b *bundle, table, cond string) {
	t.Helper()
	if _, err := b.pool.Exec(t.Context(), `
		CREATE SEQUENCE fail_once;
		CREATE FUNCTION fail_first_insert() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF `+cond+` AND nextval('fail_once') = 1 THEN
				RAISE EXCEPTION 'injected' USING ERRCODE = '40001';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER fail_first_insert BEFORE INSERT ON `+table+`
			FOR EACH ROW EXECUTE FUNCTION fail_first_insert();`); err != nil {
		t.Fatal(err)
	}
}

// TestDedupeStepSerializationFailureIsRetried makes the pipelined first
// statement itself fail with 40001 once: the attempt must roll back and the
// retry process the event, with the handler run once.
func TestDedupeStepSerializationFailureIsRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ev := event("evt_dedupe_40001")
	failFirstKeyInsert(t, b, ev.Key)
	p := b.processor(t, &txhook.Config{Tx: &txhook.TxOptions{BaseBackoff: time.Millisecond}})
	calls := 0
	mustProcess(t, p, ev, func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		calls++
		return insertEffect(ctx, tx, ev)
	}, txhook.OutcomeProcessed)
	if calls != 1 {
		t.Errorf("handler calls = %d, want 1", calls)
	}
	if n := b.count(t, "SELECT last_value::int FROM fail_once"); n != 2 {
		t.Errorf("dedupe inserts attempted = %d, want 2", n)
	}
	if n := b.effects(t, ev.Key); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
	if n := b.pool.Stat().AcquiredConns(); n != 0 {
		t.Errorf("%d connections still acquired", n)
	}
}

// TestDeadPooledConnection ends the server side of every pooled connection:
// the pipelined BEGIN meets a dead connection, which must not be handed back
// to the pool, and the event must still be applied once.
func TestDeadPooledConnection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, &txhook.Config{Tx: &txhook.TxOptions{BaseBackoff: time.Millisecond}})
	mustProcess(t, p, event("evt_before"), insertEffect, txhook.OutcomeProcessed)
	admin, err := pgx.Connect(t.Context(), b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	var killed int
	if err := admin.QueryRow(t.Context(), `SELECT count(pg_terminate_backend(pid))::int FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&killed); err != nil {
		t.Fatal(err)
	}
	if killed == 0 {
		t.Fatal("no pooled connection to end")
	}
	ev := event("evt_after")
	applied := 0
	for attempt := 1; attempt <= 5 && applied == 0; attempt++ {
		res, err := p.Process(t.Context(), ev, insertEffect)
		switch {
		case err != nil:
			t.Logf("attempt %d: %v", attempt, err)
		case res.Outcome == txhook.OutcomeProcessed:
			applied = attempt
		default:
			t.Fatalf("attempt %d: outcome %v", attempt, res.Outcome)
		}
	}
	if applied == 0 {
		t.Fatal("event not applied after the connections died")
	}
	mustProcess(t, p, ev, insertEffect, txhook.OutcomeDuplicate)
	if n := b.effects(t, ev.Key); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
	if n := b.pool.Stat().AcquiredConns(); n != 0 {
		t.Errorf("%d connections still acquired", n)
	}
}

func TestLeaseDoneMarkSharesRoundTripWithBegin(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p, tr := tracedProcessor(t, b, noMemory)
	h := txhook.LeaseHandler{
		Lease: 10 * time.Second,
		Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
			return func(ctx context.Context, tx pgx.Tx) error { return insertEffect(ctx, tx, ev) }, nil
		},
	}
	lease := func(key string) {
		t.Helper()
		res, err := p.ProcessLease(t.Context(), event(key), h)
		if err != nil || res.Outcome != txhook.OutcomeProcessed {
			t.Fatalf("process lease %s: %v, %v", key, res.Outcome, err)
		}
	}
	lease("evt_lease_warm")
	tr.Take()
	lease("evt_lease_rt")
	want := [][]string{
		{"ClaimEvent"},
		{"begin", "CompleteLease"},
		{"insert into effects (event_key) values ($1)"},
		{"commit"},
	}
	if got := tr.Take(); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("round trips %q, want %q", got, want)
	}
	if n := b.effects(t, "evt_lease_rt"); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
}

// TestQueryFirstTravelsWithBegin: a multi-row Query as a transaction's first
// statement travels with BEGIN (or SAVEPOINT) and what was deferred before
// it, its rows read from that batch; a failed query or deferred statement
// rolls back and leaves the connection idle.
func TestQueryFirstTravelsWithBegin(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, tr := pgtrace.Pool(t, b.db.URL)
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
	if err := txhook.RunTx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
		_, err := sum(ctx, tx, two)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	tr.Take()

	err := txhook.RunTx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
		if n, err := sum(ctx, tx, two); err != nil || n != 3 {
			return fmt.Errorf("sum = %d, %v; want 3", n, err)
		}
		return insertEffect(ctx, tx, event("q-1"))
	})
	if err != nil {
		t.Fatal(err)
	}
	wantTrips(t, tr, "Query first", [][]string{{"begin", two}, {insertEffectSQL}, {"commit"}})

	err = txhook.RunTx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := txhook.Deferred(tx).Exec(ctx, insertEffectSQL, "q-2"); err != nil {
			return err
		}
		_, err := sum(ctx, tx, two)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	wantTrips(t, tr, "deferred, then Query first", [][]string{{"begin", insertEffectSQL, two}, {"commit"}})

	err = txhook.RunTx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
		for _, sql := range []string{insertEffectSQL, "select 1 / 0"} {
			args := []any{"q-3"}[:strings.Count(sql, "$")]
			if _, err := txhook.Deferred(tx).Exec(ctx, sql, args...); err != nil {
				return err
			}
		}
		_, _ = sum(ctx, tx, two)
		return nil // a failed deferred statement fails the run whatever the body returns
	})
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); !ok || pgErr.Code != "22012" {
		t.Fatalf("a deferred statement failing before the query: %v, want its division by zero", err)
	}
	wantTrips(t, tr, "failed deferred statement", [][]string{{"begin", insertEffectSQL, "select 1 / 0", two}, {"rollback"}})

	if err := txhook.RunTx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
		_, err := sum(ctx, tx, "select 1 / (g - 2) from generate_series(1, 2) g")
		return err
	}); err == nil {
		t.Fatal("a failing query committed")
	}
	tr.Take()
	if n := b.count(t, `SELECT count(*) FROM effects`); n != 2 {
		t.Errorf("%d effects, want 2 (q-1 and q-2; q-3 rolled back)", n)
	}

	// Under a savepoint of the caller's transaction.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	tr.Take()
	if err := txhook.RunNestedTx(ctx, tx, func(ctx context.Context, tx pgx.Tx) error {
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
