package txhook_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/db"
)

func TestProcessSameEventTwiceHasOneEffect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, nil)
	ev := event("evt_1")

	mustProcess(t, p, ev, insertEffect, txhook.OutcomeProcessed)
	calls := 0
	mustProcess(t, p, ev, func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		calls++
		return insertEffect(ctx, tx, ev)
	}, txhook.OutcomeDuplicate)

	if calls != 0 {
		t.Errorf("handler ran %d times for a duplicate", calls)
	}
	if n := b.effects(t, "evt_1"); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
	row, err := db.New(b.pool).GetEvent(t.Context(), db.GetEventParams{Source: "test", EventKey: "evt_1"})
	if err != nil {
		t.Fatal(err)
	}
	if row.Status != "done" || row.EventType != "thing.happened" || !row.CompletedAt.Valid {
		t.Errorf("row = %+v, want done with type and completed_at", row)
	}
	if row.Payload != nil {
		t.Errorf("payload stored without StorePayload: %q", row.Payload)
	}
}

func TestSourcesAreSeparateNamespaces(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, nil)
	ev := event("evt_shared")
	mustProcess(t, p, ev, insertEffect, txhook.OutcomeProcessed)
	ev.Source = "other-endpoint"
	mustProcess(t, p, ev, insertEffect, txhook.OutcomeProcessed)
	if n := b.effects(t, "evt_shared"); n != 2 {
		t.Errorf("effects = %d, want one per source", n)
	}
}

func TestStorePayload(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, &txhook.Config{StorePayload: true})
	ev := event("evt_payload")
	ev.PayloadHash = []byte{1, 2, 3}
	mustProcess(t, p, ev, insertEffect, txhook.OutcomeProcessed)
	row, err := db.New(b.pool).GetEvent(t.Context(), db.GetEventParams{Source: "test", EventKey: ev.Key})
	if err != nil {
		t.Fatal(err)
	}
	if string(row.Payload) != string(ev.Payload) || string(row.PayloadHash) != string(ev.PayloadHash) {
		t.Errorf("stored payload %q hash %v, want %q %v", row.Payload, row.PayloadHash, ev.Payload, ev.PayloadHash)
	}
}

// Fifty concurrent deliveries of one key: the handler runs once, every other
// delivery is a duplicate (it waited for the commit) or in flight (it gave
// up waiting); none errs, and none is called a duplicate before the first
// committed.
func TestConcurrentDeliveriesRunHandlerOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 60
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	p, err := txhook.NewProcessor(pool, &txhook.Config{LockTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}

	var (
		mu       sync.Mutex
		calls    int
		outcomes = map[txhook.Outcome]int{}
		early    int // duplicates seen before the first delivery committed
		wg       sync.WaitGroup
		start    = make(chan struct{})
	)
	h := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		mu.Lock()
		calls++
		mu.Unlock()
		time.Sleep(100 * time.Millisecond) // hold the key while the others arrive
		return insertEffect(ctx, tx, ev)
	}
	for range 50 {
		wg.Go(func() {
			<-start
			res, err := p.Process(context.Background(), event("evt_storm"), h)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("process: %v", err)
				return
			}
			if res.Outcome == txhook.OutcomeDuplicate {
				// A duplicate is answered only once the event is committed:
				// its effect is visible at that moment.
				var n int
				if err := b.pool.QueryRow(context.Background(),
					"SELECT count(*) FROM effects WHERE event_key = 'evt_storm'").Scan(&n); err != nil {
					t.Error(err)
				} else if n != 1 {
					early++
				}
			}
			outcomes[res.Outcome]++
		})
	}
	close(start)
	wg.Wait()

	if calls != 1 || outcomes[txhook.OutcomeProcessed] != 1 {
		t.Errorf("handler calls = %d, processed = %d; want 1 and 1", calls, outcomes[txhook.OutcomeProcessed])
	}
	if got := outcomes[txhook.OutcomeDuplicate] + outcomes[txhook.OutcomeInFlight]; got != 49 {
		t.Errorf("duplicate + in flight = %d, want 49 (outcomes %v)", got, outcomes)
	}
	if early != 0 {
		t.Errorf("%d deliveries were answered duplicate before the event committed", early)
	}
	if n := b.effects(t, "evt_storm"); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
	t.Logf("outcomes: %v", outcomes)
}

func TestHandlerErrorCommitsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, nil)
	ev := event("evt_err")
	boom := errors.New("boom")

	_, err := p.Process(t.Context(), ev, func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		if err := insertEffect(ctx, tx, ev); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	if n := b.keys(t); n != 0 {
		t.Errorf("keys after handler error = %d, want 0", n)
	}
	if n := b.effects(t, ev.Key); n != 0 {
		t.Errorf("effects after handler error = %d, want 0", n)
	}
	// The provider's retry processes the event.
	mustProcess(t, p, ev, insertEffect, txhook.OutcomeProcessed)
	if n := b.effects(t, ev.Key); n != 1 {
		t.Errorf("effects after retry = %d, want 1", n)
	}
}

func TestHandlerPanicRollsBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, nil)
	ev := event("evt_panic")

	func() {
		defer func() {
			if r := recover(); r != "kaboom" {
				t.Errorf("recovered %v, want the handler's panic", r)
			}
		}()
		_, _ = p.Process(t.Context(), ev, func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
			if err := insertEffect(ctx, tx, ev); err != nil {
				return err
			}
			panic("kaboom")
		})
		t.Error("panic was swallowed")
	}()
	if n := b.keys(t); n != 0 {
		t.Errorf("keys after panic = %d, want 0", n)
	}
	if n := b.effects(t, ev.Key); n != 0 {
		t.Errorf("effects after panic = %d, want 0", n)
	}
	mustProcess(t, p, ev, insertEffect, txhook.OutcomeProcessed)
}

// raise makes the server fail the current statement with a SQLSTATE.
func raise(ctx context.Context, tx pgx.Tx, sqlstate string) error {
	_, err := tx.Exec(ctx, fmt.Sprintf(
		`DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '%s'; END $$`, sqlstate))
	return err
}

func TestSerializationFailureAndDeadlockAreRetried(t *testing.T) {
	t.Parallel()
	for _, code := range []string{"40001", "40P01"} {
		t.Run(code, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			p := b.processor(t, &txhook.Config{Tx: &txhook.TxOptions{IsoLevel: pgx.Serializable}})
			ev := event("evt_retry")
			calls := 0
			mustProcess(t, p, ev, func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
				calls++
				if err := insertEffect(ctx, tx, ev); err != nil {
					return err
				}
				if calls == 1 {
					return raise(ctx, tx, code)
				}
				return nil
			}, txhook.OutcomeProcessed)
			if calls != 2 {
				t.Errorf("handler calls = %d, want 2", calls)
			}
			if n := b.effects(t, ev.Key); n != 1 {
				t.Errorf("effects = %d, want 1", n)
			}
		})
	}
}

func TestRetriesAreBounded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, &txhook.Config{Tx: &txhook.TxOptions{MaxAttempts: 4, BaseBackoff: time.Millisecond}})
	calls := 0
	_, err := p.Process(t.Context(), event("evt_always"), func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		calls++
		return raise(ctx, tx, "40001")
	})
	if err == nil || !strings.Contains(err.Error(), "40001") {
		t.Fatalf("err = %v, want the serialization failure", err)
	}
	if calls != 4 {
		t.Errorf("handler calls = %d, want MaxAttempts = 4", calls)
	}
	if n := b.keys(t); n != 0 {
		t.Errorf("keys = %d, want 0", n)
	}
}

func TestOtherErrorsAreNotRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, nil)
	calls := 0
	_, err := p.Process(t.Context(), event("evt_unique"), func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		calls++
		return raise(ctx, tx, "23505")
	})
	if err == nil || calls != 1 {
		t.Fatalf("err = %v, calls = %d; want an error after one call", err, calls)
	}
}

func TestCancelledContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, nil)

	t.Run("before", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := p.Process(ctx, event("evt_cancel_before"), insertEffect)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want context.Canceled", err)
		}
	})
	t.Run("during handler", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		_, err := p.Process(ctx, event("evt_cancel_during"), func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
			if err := insertEffect(ctx, tx, ev); err != nil {
				return err
			}
			cancel() // the request goes away while the handler works
			_, err := tx.Exec(ctx, "SELECT pg_sleep(5)")
			return err
		})
		if err == nil {
			t.Fatal("process succeeded after its context was cancelled")
		}
	})
	if n := b.keys(t); n != 0 {
		t.Errorf("keys = %d, want 0", n)
	}
	if n := b.count(t, "SELECT count(*) FROM effects"); n != 0 {
		t.Errorf("effects = %d, want 0", n)
	}
	// No transaction was left open on a pooled connection.
	if n := b.count(t, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'"); n != 0 {
		t.Errorf("%d connections idle in transaction", n)
	}
	mustProcess(t, p, event("evt_cancel_during"), insertEffect, txhook.OutcomeProcessed)
}

func TestInvalidEventsAreRejectedAndWriteNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, &txhook.Config{MaxKeyLen: 16})
	cases := []struct {
		name string
		ev   txhook.Event
		want error
	}{
		{"empty source", txhook.Event{Key: "k"}, txhook.ErrEmpty},
		{"empty key", txhook.Event{Source: "s"}, txhook.ErrEmpty},
		{"long key", txhook.Event{Source: "s", Key: strings.Repeat("k", 17)}, txhook.ErrTooLong},
		{"long source", txhook.Event{Source: strings.Repeat("s", 129), Key: "k"}, txhook.ErrTooLong},
		{"long type", txhook.Event{Source: "s", Key: "k", Type: strings.Repeat("t", 256)}, txhook.ErrTooLong},
		{"invalid UTF-8 key", txhook.Event{Source: "s", Key: "k\xff"}, txhook.ErrNotText},
		{"invalid UTF-8 source", txhook.Event{Source: "\xc3", Key: "k"}, txhook.ErrNotText},
		{"invalid UTF-8 type", txhook.Event{Source: "s", Key: "k", Type: "a\xffb"}, txhook.ErrNotText},
		{"NUL in key", txhook.Event{Source: "s", Key: "k\x00"}, txhook.ErrNotText},
		{"NUL in source", txhook.Event{Source: "s\x00", Key: "k"}, txhook.ErrNotText},
		{"NUL in type", txhook.Event{Source: "s", Key: "k", Type: "t\x00"}, txhook.ErrNotText},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			calls := 0
			_, err := p.Process(t.Context(), c.ev, func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
				calls++
				return insertEffect(ctx, tx, ev)
			})
			if !errors.Is(err, c.want) || !errors.Is(err, txhook.ErrInvalidEvent) {
				t.Errorf("err = %v, want %v and ErrInvalidEvent", err, c.want)
			}
			var verr *txhook.ValidationError
			if !errors.As(err, &verr) {
				t.Errorf("err = %T, want *ValidationError", err)
			}
			if calls != 0 {
				t.Error("handler ran for an invalid event")
			}
		})
	}
	if n := b.keys(t); n != 0 {
		t.Errorf("keys = %d, want 0", n)
	}
	// Exactly at the limit is fine; a payload may hold any bytes.
	ev := txhook.Event{Source: "s", Key: strings.Repeat("k", 16), Payload: []byte("\x00\xff")}
	mustProcess(t, p, ev, insertEffect, txhook.OutcomeProcessed)
}

func TestLockWaitBoundAnswersInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, &txhook.Config{LockTimeout: 100 * time.Millisecond, InFlightRetryAfter: 3 * time.Second})
	ev := event("evt_slow")
	first := holdKey(t, p, ev, false)

	res := mustProcess(t, p, ev, insertEffect, txhook.OutcomeInFlight)
	if res.RetryAfter != 3*time.Second {
		t.Errorf("RetryAfter = %v, want 3s", res.RetryAfter)
	}
	// The bound is restored after the dedupe step: a handler's own lock
	// waits are not cut short by it.
	if err := first.finish(t); err != nil {
		t.Fatal(err)
	}
	mustProcess(t, p, ev, insertEffect, txhook.OutcomeDuplicate)
	if n := b.effects(t, ev.Key); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
}

func TestWaiterProcessesWhenFirstDeliveryRollsBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, &txhook.Config{LockTimeout: 10 * time.Second})
	ev := event("evt_rollback")
	first := holdKey(t, p, ev, true)

	second := inBackground(func() (txhook.Result, error) { return p.Process(boundedCtx(t), ev, insertEffect) })
	waitForLockWaiter(t, b.pool) // the second delivery queues on the key
	if err := first.finish(t); err == nil {
		t.Fatal("first delivery should have failed")
	}
	select {
	case a := <-second:
		if a.err != nil || a.res.Outcome != txhook.OutcomeProcessed {
			t.Errorf("second delivery = %v, %v; want processed", a.res.Outcome, a.err)
		}
	case <-time.After(waitBound):
		t.Fatal("second delivery did not answer")
	}
	if n := b.effects(t, ev.Key); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
}

func TestLockTimeoutDoesNotLeakIntoHandler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, &txhook.Config{LockTimeout: 50 * time.Millisecond})
	var inHandler string
	mustProcess(t, p, event("evt_setting"), func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		return tx.QueryRow(ctx, "SHOW lock_timeout").Scan(&inHandler)
	}, txhook.OutcomeProcessed)
	if inHandler != "0" {
		t.Errorf("lock_timeout in handler = %q, want the session default 0", inHandler)
	}
}

func TestPermanentErrorRecordsFailedEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, &txhook.Config{StorePayload: true})
	ev := event("evt_perm")
	cause := errors.New("unknown account acct_9")
	res, err := p.Process(t.Context(), ev, func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		if err := insertEffect(ctx, tx, ev); err != nil {
			return err
		}
		return txhook.Permanent(fmt.Errorf("look up account: %w", cause))
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != txhook.OutcomeFailed || !errors.Is(res.Err, cause) {
		t.Fatalf("result = %+v, want failed with the cause", res)
	}
	if n := b.effects(t, ev.Key); n != 0 {
		t.Errorf("effects = %d, want 0: the handler's writes roll back", n)
	}
	row, err := db.New(b.pool).GetEvent(t.Context(), db.GetEventParams{Source: ev.Source, EventKey: ev.Key})
	if err != nil {
		t.Fatal(err)
	}
	if row.Status != "failed" || !strings.Contains(row.LastError.String, "acct_9") || string(row.Payload) != string(ev.Payload) {
		t.Errorf("row = %+v, want failed with error text and payload", row)
	}
	// The provider's retry is a duplicate: the event waits for an operator.
	mustProcess(t, p, ev, insertEffect, txhook.OutcomeDuplicate)
}

func TestProcessTxJoinsCallersTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, nil)
	ctx := t.Context()

	// Rolled back by the caller: nothing stays.
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.ProcessTx(ctx, tx, event("evt_join"), insertEffect)
	if err != nil || res.Outcome != txhook.OutcomeProcessed {
		t.Fatalf("ProcessTx = %+v, %v", res, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.keys(t); n != 0 {
		t.Fatalf("keys after caller's rollback = %d", n)
	}

	// Committed by the caller, with a duplicate and a failing handler in
	// between that leave the transaction usable.
	tx, err = b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := p.ProcessTx(ctx, tx, event("evt_join"), insertEffect); err != nil {
		t.Fatal(err)
	}
	if res, err := p.ProcessTx(ctx, tx, event("evt_join"), insertEffect); err != nil || res.Outcome != txhook.OutcomeDuplicate {
		t.Fatalf("second ProcessTx = %+v, %v; want duplicate", res, err)
	}
	if _, err := p.ProcessTx(ctx, tx, event("evt_join_bad"), func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		if err := insertEffect(ctx, tx, ev); err != nil {
			return err
		}
		return raise(ctx, tx, "23514")
	}); err == nil {
		t.Fatal("failing handler returned nil")
	}
	if _, err := tx.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ('caller', 'own write')"); err != nil {
		t.Fatalf("caller's transaction unusable: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.effects(t, "evt_join"); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
	if n := b.effects(t, "evt_join_bad"); n != 0 {
		t.Errorf("failed handler's effects = %d, want 0", n)
	}
	if n := b.keys(t); n != 1 {
		t.Errorf("keys = %d, want 1", n)
	}
}

func TestWithQueriesPassesGeneratedQueries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, nil)
	var seen string
	h := txhook.WithQueries(db.New, func(ctx context.Context, q *db.Queries, ev txhook.Event) error {
		// The queries run on the event's transaction: they see its key.
		row, err := q.GetEvent(ctx, db.GetEventParams{Source: ev.Source, EventKey: ev.Key})
		seen = row.Status
		return err
	})
	mustProcess(t, p, event("evt_queries"), h, txhook.OutcomeProcessed)
	if seen != "done" {
		t.Errorf("status seen inside the transaction = %q, want done", seen)
	}
}

func TestWithQueriesRejectsUnusableConstructor(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("WithQueries accepted a constructor whose parameter pgx.Tx cannot satisfy")
		}
	}()
	type notDBTX interface{ NoSuchMethod() }
	txhook.WithQueries(func(notDBTX) int { return 0 }, func(context.Context, int, txhook.Event) error { return nil })
}

func TestNewProcessorValidatesConfig(t *testing.T) {
	if _, err := txhook.NewProcessor(nil, nil); err == nil {
		t.Error("nil database accepted")
	}
	var pool *pgxpool.Pool
	if _, err := txhook.NewProcessor(pool, &txhook.Config{LockTimeout: -time.Second}); err == nil {
		t.Error("negative lock timeout accepted")
	}
}

// A delivery whose dedupe step waits on a lease-mode claim of its key,
// which then commits, answers in flight, not duplicate: the claim is read
// after the wait, in a snapshot that sees it (the insert's own snapshot,
// taken before it waited, cannot). Through Process and through ProcessTx.
func TestDedupeWaitingOnALeaseClaimAnswersInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, nil)
	ctx := t.Context()
	for _, inTx := range []bool{false, true} {
		key := fmt.Sprintf("evt_claimed_in_tx_%v", inTx)
		// The row a lease-mode claim records, not committed yet.
		claim := holdRow(t, b.pool, `INSERT INTO txhook_processed_events (source, event_key, event_type, status, lease_expires_at)
			VALUES ('test', $1, 'thing.happened', 'in_progress', now() + interval '1 minute')`, key)
		done := inBackground(func() (res txhook.Result, err error) {
			if !inTx {
				return p.Process(ctx, event(key), insertEffect)
			}
			err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				var err error
				res, err = p.ProcessTx(ctx, tx, event(key), insertEffect)
				return err
			})
			return res, err
		})
		waitForLockWaiter(t, b.pool)
		if err := claim.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		a := <-done
		if a.err != nil {
			t.Fatalf("in a transaction %v: %v", inTx, a.err)
		}
		if a.res.Outcome != txhook.OutcomeInFlight || a.res.RetryAfter < 30*time.Second {
			t.Errorf("in a transaction %v: %v after %v, want in flight until the claim's lease ends, in about a minute", inTx, a.res.Outcome, a.res.RetryAfter)
		}
		if n := b.effects(t, key); n != 0 {
			t.Errorf("in a transaction %v: %d effects, want none", inTx, n)
		}
	}
}
