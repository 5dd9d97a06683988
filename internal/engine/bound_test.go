package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook/internal/engine"
)

// holdRow locks the row of accounts with id 1 in a transaction of its own
// until the returned release is called (or the test ends).
func holdRow(t *testing.T, e *env) (release func()) {
	t.Helper()
	if _, err := e.pool.Exec(t.Context(), `CREATE TABLE IF NOT EXISTS accounts (id int PRIMARY KEY, n int NOT NULL);
		INSERT INTO accounts VALUES (1, 0) ON CONFLICT DO NOTHING`); err != nil {
		t.Fatal(err)
	}
	tx, err := e.pool.Begin(t.Context())
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

// bump is a body whose first statement updates the row holdRow locks.
func bump(calls *int, key string) func(ctx context.Context, tx pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		*calls++
		if _, err := tx.Exec(ctx, "UPDATE accounts SET n = n + 1 WHERE id = 1"); err != nil {
			return err
		}
		return insertEffect(key)(ctx, tx)
	}
}

// deliverWithin runs d and fails the test when it has not returned within
// limit.
func deliverWithin(t *testing.T, limit time.Duration, d delivery, e *env, key string, body func(ctx context.Context, tx pgx.Tx) error) string {
	t.Helper()
	type answer struct {
		res string
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		res, err := d.run(context.Background(), engine.Begin(e.pool), key, body)
		ch <- answer{res, err}
	}()
	select {
	case a := <-ch:
		if a.err != nil {
			t.Fatalf("deliver %s: %v", key, a.err)
		}
		return a.res
	case <-time.After(limit):
		t.Fatalf("deliver %s: no answer within %v", key, limit)
	}
	return ""
}

// TestDuplicateNeverWaitsLongWithFirstStatement: under WithFirstStatement,
// a duplicate's first statement runs before the first step's answer is
// known; when it waits on a business row that another delivery holds, it
// waits at most the bound, and the answer is the duplicate's.
func TestDuplicateNeverWaitsLongWithFirstStatement(t *testing.T) {
	t.Parallel()
	e := setup(t)
	d := delivery{withFirst: true, lockTimeout: 200 * time.Millisecond}
	var calls int
	holdRow(t, e)() // creates the table
	d.must(t, e.pool, "evt_done_before", bump(&calls, "evt_done_before"), processed)

	holdRow(t, e) // an in-flight delivery holds the business row
	start := time.Now()
	if res := deliverWithin(t, 10*time.Second, d, e, "evt_done_before", bump(&calls, "evt_done_before")); res != duplicate {
		t.Errorf("outcome %v, want duplicate", res)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Errorf("the duplicate waited %v on the business row, want about the bound", waited)
	}
}

// TestNewKeyFirstStatementPastTheBound: a new key's first statement, sent
// with the first step, runs under the session's own lock_timeout (the
// dedupe step restored it as it recorded the key), not the bound: it waits
// on a business row past the bound, in the one attempt, and the body's
// work commits once the row is free. The body's later statements run with
// the session's own lock_timeout too.
func TestNewKeyFirstStatementPastTheBound(t *testing.T) {
	t.Parallel()
	e := setup(t)
	d := delivery{withFirst: true, lockTimeout: 200 * time.Millisecond}
	release := holdRow(t, e)
	go func() {
		time.Sleep(time.Second)
		release()
	}()
	var calls int
	if res := deliverWithin(t, 10*time.Second, d, e, "evt_new_waits", bump(&calls, "evt_new_waits")); res != processed {
		t.Errorf("outcome %v, want processed", res)
	}
	if calls != 1 {
		t.Errorf("body calls = %d, want 1 (its first statement waited under the session's setting)", calls)
	}
	if n := e.effects(t, "evt_new_waits"); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}

	var later string
	d.must(t, e.pool, "evt_setting", func(ctx context.Context, tx pgx.Tx) error {
		if err := insertEffect("evt_setting")(ctx, tx); err != nil {
			return err
		}
		return tx.QueryRow(ctx, "SELECT current_setting('lock_timeout')").Scan(&later)
	}, processed)
	var session string
	if err := e.pool.QueryRow(t.Context(), "SELECT current_setting('lock_timeout')").Scan(&session); err != nil {
		t.Fatal(err)
	}
	if later != session {
		t.Errorf("lock_timeout after the first statement = %q, want the session's %q", later, session)
	}
}

// TestNewKeyFirstStatementNowait: a new key whose first statement, sent
// with the first step, refuses to wait (NOWAIT) on a row another
// transaction holds fails at once whatever the bound: the body runs once
// and the run returns its error, not a second attempt.
func TestNewKeyFirstStatementNowait(t *testing.T) {
	t.Parallel()
	e := setup(t)
	holdRow(t, e)
	var calls int
	_, err := delivery{withFirst: true}.run(t.Context(), engine.Begin(e.pool), "evt_nowait", func(ctx context.Context, tx pgx.Tx) error {
		calls++
		if _, err := tx.Exec(ctx, "SELECT * FROM accounts WHERE id = 1 FOR UPDATE NOWAIT"); err != nil {
			return err
		}
		return insertEffect("evt_nowait")(ctx, tx)
	})
	if pgCode(err) != pgerrcode.LockNotAvailable {
		t.Errorf("run error = %v, want the body's lock_not_available", err)
	}
	if calls != 1 {
		t.Errorf("body calls = %d, want 1", calls)
	}
	if n := e.effects(t, "evt_nowait"); n != 0 {
		t.Errorf("effects = %d, want 0", n)
	}
}

// TestBodyFirstStatementSetsLockTimeout: under WithFirstStatement, a body
// whose first statement (sent with the first step) sets lock_timeout keeps
// its own setting for its later statements: the dedupe step restored the
// session's before it.
func TestBodyFirstStatementSetsLockTimeout(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, tc := range []struct{ key, set string }{
		{"evt_set_local", "SET LOCAL lock_timeout = '123ms'"},
		{"evt_set_config", "SELECT set_config('lock_timeout', '123ms', true)"},
	} {
		var after string
		delivery{withFirst: true}.must(t, e.pool, tc.key, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, tc.set); err != nil {
				return err
			}
			if err := insertEffect(tc.key)(ctx, tx); err != nil {
				return err
			}
			return tx.QueryRow(ctx, "SHOW lock_timeout").Scan(&after)
		}, processed)
		if after != "123ms" {
			t.Errorf("%s: lock_timeout after the body's own setting = %q, want 123ms", tc.set, after)
		}
		if n := e.effects(t, tc.key); n != 1 {
			t.Errorf("%s: effects = %d, want 1", tc.set, n)
		}
	}
}
