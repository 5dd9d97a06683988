package txhook_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txhook/txhook"
)

// holdRow locks the row of accounts with id 1 in a transaction of its own
// until the returned release is called (or the test ends).
func holdRow(t *testing.T, b *bundle) (release func()) {
	t.Helper()
	if _, err := b.pool.Exec(t.Context(), `CREATE TABLE IF NOT EXISTS accounts (id int PRIMARY KEY, n int NOT NULL);
		INSERT INTO accounts VALUES (1, 0) ON CONFLICT DO NOTHING`); err != nil {
		t.Fatal(err)
	}
	tx, err := b.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(t.Context(), "SELECT * FROM accounts WHERE id = 1 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	done := false
	release = func() {
		if !done {
			done = true
			tx.Rollback(context.Background())
		}
	}
	t.Cleanup(release)
	return release
}

// bump is a handler whose first statement updates the row holdRow locks.
func bump(calls *int) txhook.HandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		*calls++
		if _, err := tx.Exec(ctx, "UPDATE accounts SET n = n + 1 WHERE id = 1"); err != nil {
			return err
		}
		return insertEffect(ctx, tx, ev)
	}
}

// processWithin runs Process and fails the test when it has not returned
// within limit.
func processWithin(t *testing.T, limit time.Duration, p *txhook.Processor, ev txhook.Event, h txhook.HandlerFunc) txhook.Result {
	t.Helper()
	type answer struct {
		res txhook.Result
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		res, err := p.Process(context.Background(), ev, h)
		ch <- answer{res, err}
	}()
	select {
	case a := <-ch:
		if a.err != nil {
			t.Fatalf("process %s: %v", ev.Key, a.err)
		}
		return a.res
	case <-time.After(limit):
		t.Fatalf("process %s: no answer within %v", ev.Key, limit)
	}
	return txhook.Result{}
}

// TestDuplicateNeverWaitsLongWithFirstStatement: under
// DedupeWithFirstStatement, a duplicate's first statement runs before the
// dedupe step's answer is known; when it waits on a business row that
// another delivery holds, it waits at most LockTimeout, and the answer is
// the duplicate's.
func TestDuplicateNeverWaitsLongWithFirstStatement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, &txhook.Config{DedupeWithFirstStatement: true, LockTimeout: 200 * time.Millisecond, RecentKeys: -1})
	var calls int
	holdRow(t, b)() // creates the table
	mustProcess(t, p, event("evt_done_before"), bump(&calls), txhook.OutcomeProcessed)

	holdRow(t, b) // an in-flight delivery holds the business row
	start := time.Now()
	res := processWithin(t, 10*time.Second, p, event("evt_done_before"), bump(&calls))
	if res.Outcome != txhook.OutcomeDuplicate {
		t.Errorf("outcome %v, want duplicate", res.Outcome)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Errorf("the duplicate waited %v on the business row, want about LockTimeout", waited)
	}
}

// TestNewKeyFirstStatementPastTheBound: a new key whose first statement
// waits on a business row past LockTimeout is not answered in flight nor
// failed: the attempt runs again with the dedupe step first and the
// handler's own lock setting, and the event is processed once the row is
// free. The handler's statements after the first run with the session's
// own lock_timeout.
func TestNewKeyFirstStatementPastTheBound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, &txhook.Config{DedupeWithFirstStatement: true, LockTimeout: 200 * time.Millisecond, RecentKeys: -1})
	release := holdRow(t, b)
	go func() {
		time.Sleep(time.Second)
		release()
	}()
	var calls int
	res := processWithin(t, 10*time.Second, p, event("evt_new_waits"), bump(&calls))
	if res.Outcome != txhook.OutcomeProcessed {
		t.Errorf("outcome %v, want processed", res.Outcome)
	}
	if calls != 2 {
		t.Errorf("handler calls = %d, want 2 (bounded, then with the dedupe step first)", calls)
	}
	if n := b.effects(t, "evt_new_waits"); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}

	var later string
	mustProcess(t, p, event("evt_setting"), func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		if err := insertEffect(ctx, tx, ev); err != nil {
			return err
		}
		return tx.QueryRow(ctx, "SELECT current_setting('lock_timeout')").Scan(&later)
	}, txhook.OutcomeProcessed)
	var session string
	if err := b.pool.QueryRow(t.Context(), "SELECT current_setting('lock_timeout')").Scan(&session); err != nil {
		t.Fatal(err)
	}
	if later != session {
		t.Errorf("lock_timeout after the first statement = %q, want the session's %q", later, session)
	}
}

// TestNewKeyFirstStatementNowait: a new key whose first statement, sent
// with the dedupe step, refuses to wait (NOWAIT) on a row another
// transaction holds fails at once whatever the bound: the handler runs once
// and Process returns its error, not a second attempt.
func TestNewKeyFirstStatementNowait(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, &txhook.Config{DedupeWithFirstStatement: true, RecentKeys: -1})
	holdRow(t, b)
	var calls int
	_, err := p.Process(t.Context(), event("evt_nowait"), func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		calls++
		if _, err := tx.Exec(ctx, "SELECT * FROM accounts WHERE id = 1 FOR UPDATE NOWAIT"); err != nil {
			return err
		}
		return insertEffect(ctx, tx, ev)
	})
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); !ok || pgErr.Code != "55P03" {
		t.Errorf("Process error = %v, want the handler's lock_not_available", err)
	}
	if calls != 1 {
		t.Errorf("handler calls = %d, want 1", calls)
	}
	if n := b.effects(t, "evt_nowait"); n != 0 {
		t.Errorf("effects = %d, want 0", n)
	}
}

// TestReplayGuardInFlightWithFirstStatement: under DedupeWithFirstStatement
// the replay guard's check is the handler's first statement, sent with the
// dedupe step; its wait on another delivery of the same body is bounded by
// the guard's own LockTimeout, and the delivery is answered
// ErrReplayInFlight after that wait, once, not after a second attempt.
func TestReplayGuardInFlightWithFirstStatement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const wait = 400 * time.Millisecond
	p := b.processor(t, &txhook.Config{DedupeWithFirstStatement: true, RecentKeys: -1})
	g := txhook.ReplayGuard{LockTimeout: wait}
	withHash := func(key string) txhook.Event {
		ev := event(key)
		ev.PayloadHash = []byte("same body")
		return ev
	}
	// Another delivery of the body holds the guard's lock.
	tx, err := b.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if res, err := p.ProcessTx(t.Context(), tx, withHash("evt_first"), g.Handler(insertEffect)); err != nil || res.Outcome != txhook.OutcomeProcessed {
		t.Fatalf("ProcessTx = %v, %v; want processed", res.Outcome, err)
	}

	var calls int
	h := g.Handler(insertEffect)
	start := time.Now()
	_, err = p.Process(t.Context(), withHash("evt_second"), func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		calls++
		return h(ctx, tx, ev)
	})
	elapsed := time.Since(start)
	if !errors.Is(err, txhook.ErrReplayInFlight) {
		t.Fatalf("Process error = %v, want ErrReplayInFlight", err)
	}
	if calls != 1 {
		t.Errorf("handler calls = %d, want 1", calls)
	}
	if limit := wait * 3 / 2; elapsed >= limit {
		t.Errorf("answered after %v, want about the guard's LockTimeout %v (below %v)", elapsed, wait, limit)
	}
}

// TestHandlerFirstStatementSetsLockTimeout: under DedupeWithFirstStatement,
// a handler whose first statement (sent with the dedupe step, under its
// bound) sets lock_timeout keeps its own setting for its later statements:
// the session's is restored only while the bound is still in force.
func TestHandlerFirstStatementSetsLockTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, &txhook.Config{DedupeWithFirstStatement: true, RecentKeys: -1})
	for _, tc := range []struct{ key, set string }{
		{"evt_set_local", "SET LOCAL lock_timeout = '123ms'"},
		{"evt_set_config", "SELECT set_config('lock_timeout', '123ms', true)"},
	} {
		var after string
		mustProcess(t, p, event(tc.key), func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
			if _, err := tx.Exec(ctx, tc.set); err != nil {
				return err
			}
			if err := insertEffect(ctx, tx, ev); err != nil {
				return err
			}
			return tx.QueryRow(ctx, "SHOW lock_timeout").Scan(&after)
		}, txhook.OutcomeProcessed)
		if after != "123ms" {
			t.Errorf("%s: lock_timeout after the handler's own setting = %q, want 123ms", tc.set, after)
		}
		if n := b.effects(t, tc.key); n != 1 {
			t.Errorf("%s: effects = %d, want 1", tc.set, n)
		}
	}
}
