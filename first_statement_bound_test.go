package txhook_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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
