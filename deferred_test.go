package txhook_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txhook/txhook"
)

const insertNoteSQL = "insert into effects (event_key, note) values ($1, $2)"

// deferNote queues an effect row with note through txhook.Deferred.
func deferNote(ctx context.Context, tx pgx.Tx, key, note string) error {
	_, err := txhook.Deferred(tx).Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, $2)", key, note)
	return err
}

// writeThenDefer writes one effect and defers a second.
func writeThenDefer(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
	if err := insertEffect(ctx, tx, ev); err != nil {
		return err
	}
	return deferNote(ctx, tx, ev.Key, "deferred")
}

// TestDeferredRoundTrips: deferred statements travel with COMMIT or with the
// next statement, never alone, in both orders of the dedupe step, and are
// not sent at all for a duplicate or a failed handler.
func TestDeferredRoundTrips(t *testing.T) {
	t.Parallel()
	for _, first := range []bool{false, true} {
		name := "dedupe step first"
		if first {
			name = "dedupe with first statement"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			p, tr := tracedProcessor(t, b, &txhook.Config{DedupeWithFirstStatement: first, RecentKeys: -1})
			trips := func(dedupeFirst, withFirst [][]string) [][]string {
				if first {
					return withFirst
				}
				return dedupeFirst
			}
			tr.Take()

			mustProcess(t, p, event("evt_write_defer"), writeThenDefer, txhook.OutcomeProcessed)
			wantTrips(t, tr, "write, then deferred write", trips(
				[][]string{{"begin", "InsertEvent"}, {insertEffectSQL}, {insertNoteSQL, "commit"}},
				[][]string{{"begin", "LockTimeoutBound", "InsertEvent", insertEffectSQL, "LockTimeoutRestored"}, {insertNoteSQL, "commit"}},
			))

			deferTwiceThenRead := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
				if err := deferNote(ctx, tx, ev.Key, "one"); err != nil {
					return err
				}
				if err := deferNote(ctx, tx, ev.Key, "two"); err != nil {
					return err
				}
				var n int
				return tx.QueryRow(ctx, "SELECT count(*) FROM effects WHERE event_key = $1", ev.Key).Scan(&n)
			}
			mustProcess(t, p, event("evt_defer_read"), deferTwiceThenRead, txhook.OutcomeProcessed)
			const countSQL = "select count(*) from effects where event_key = $1"
			wantTrips(t, tr, "two deferred writes, then a read", trips(
				[][]string{{"begin", "InsertEvent"}, {insertNoteSQL, insertNoteSQL, countSQL}, {"commit"}},
				[][]string{{"begin", "LockTimeoutBound", "InsertEvent", insertNoteSQL, insertNoteSQL, countSQL, "LockTimeoutRestored"}, {"commit"}},
			))

			onlyDeferred := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
				return deferNote(ctx, tx, ev.Key, "only")
			}
			mustProcess(t, p, event("evt_only_deferred"), onlyDeferred, txhook.OutcomeProcessed)
			wantTrips(t, tr, "only a deferred write", [][]string{{"begin", "InsertEvent"}, {insertNoteSQL, "commit"}})

			for key, want := range map[string]int{"evt_write_defer": 2, "evt_defer_read": 2, "evt_only_deferred": 1} {
				if n := b.effects(t, key); n != want {
					t.Errorf("%s: %d effects, want %d", key, n, want)
				}
			}

			mustProcess(t, p, event("evt_write_defer"), writeThenDefer, txhook.OutcomeDuplicate)
			wantTrips(t, tr, "duplicate", trips(
				[][]string{{"begin", "InsertEvent"}, {"rollback"}},
				[][]string{{"begin", "LockTimeoutBound", "InsertEvent", insertEffectSQL, "LockTimeoutRestored"}, {"rollback"}},
			))
			if n := b.effects(t, "evt_write_defer"); n != 2 {
				t.Errorf("duplicate: %d effects, want the first delivery's 2", n)
			}

			failing := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
				if err := deferNote(ctx, tx, ev.Key, "never sent"); err != nil {
					return err
				}
				return errors.New("handler failed")
			}
			if _, err := p.Process(t.Context(), event("evt_handler_fails"), failing); err == nil {
				t.Fatal("a failing handler's delivery returned no error")
			}
			wantTrips(t, tr, "failing handler", [][]string{{"begin", "InsertEvent"}, {"rollback"}})
			if n := b.effects(t, "evt_handler_fails"); n != 0 {
				t.Errorf("failing handler: %d effects", n)
			}
		})
	}
}

// TestDeferredStatementFails: a deferred statement that fails, at COMMIT or
// before a later statement, fails the delivery whatever the handler
// returns: nothing commits, the event is not recorded as failed, the error
// is the statement's (not an unknown commit), and the connection goes back
// to the pool usable.
func TestDeferredStatementFails(t *testing.T) {
	t.Parallel()
	const badSQL = "INSERT INTO no_such_table (x) VALUES ($1)"
	cases := map[string]txhook.HandlerFunc{
		"at commit": func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
			if err := insertEffect(ctx, tx, ev); err != nil {
				return err
			}
			_, err := txhook.Deferred(tx).Exec(ctx, badSQL, 1)
			return err
		},
		"before a later statement": func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
			if err := insertEffect(ctx, tx, ev); err != nil {
				return err
			}
			if _, err := txhook.Deferred(tx).Exec(ctx, badSQL, 1); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "INSERT INTO effects (event_key, note) VALUES ($1, 'after')", ev.Key); err != nil {
				// What a handler may do with an error it cannot fix; the
				// deferred statement's failure must still decide.
				return txhook.Permanent(err)
			}
			return nil
		},
		"with the first statement": func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
			if _, err := txhook.Deferred(tx).Exec(ctx, badSQL, 1); err != nil {
				return err
			}
			return txhook.Permanent(insertEffect(ctx, tx, ev))
		},
	}
	for name, h := range cases {
		for _, first := range []bool{false, true} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				p, err := txhook.NewProcessor(b.pool, &txhook.Config{DedupeWithFirstStatement: first})
				if err != nil {
					t.Fatal(err)
				}
				ev := event("evt_deferred_fails")
				res, err := p.Process(t.Context(), ev, h)
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
					t.Fatalf("first=%v: Process = %+v, %v; want the deferred statement's 42P01", first, res, err)
				}
				if !strings.Contains(err.Error(), "deferred statement") {
					t.Errorf("first=%v: error %q does not say a deferred statement failed", first, err)
				}
				if txhook.IsPermanent(err) || errors.As(err, new(*txhook.CommitUnknownError)) {
					t.Errorf("first=%v: error %v is permanent or an unknown commit", first, err)
				}
				if n := b.keys(t); n != 0 {
					t.Errorf("first=%v: %d keys recorded", first, n)
				}
				if n := b.effects(t, ev.Key); n != 0 {
					t.Errorf("first=%v: %d effects committed", first, n)
				}
				if n := b.pool.Stat().AcquiredConns(); n != 0 {
					t.Errorf("first=%v: %d connections still acquired", first, n)
				}
				// The retry, with a handler that defers nothing wrong.
				mustProcess(t, p, ev, writeThenDefer, txhook.OutcomeProcessed)
				if n := b.effects(t, ev.Key); n != 2 {
					t.Errorf("first=%v: retry left %d effects, want 2", first, n)
				}
			})
		}
	}
}

// TestDeferredSerializationFailureIsRetried: a deferred statement sent with
// COMMIT that fails with 40001 retries the whole transaction, whose work
// then commits once.
func TestDeferredSerializationFailureIsRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	failFirstInsert(t, b, "effects", "NEW.note = 'deferred'")
	p := b.processor(t, &txhook.Config{DedupeWithFirstStatement: true, Tx: &txhook.TxOptions{BaseBackoff: time.Millisecond}})
	calls := 0
	ev := event("evt_deferred_40001")
	mustProcess(t, p, ev, func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		calls++
		return writeThenDefer(ctx, tx, ev)
	}, txhook.OutcomeProcessed)
	if calls != 2 {
		t.Errorf("handler calls = %d, want 2 (the first attempt rolled back)", calls)
	}
	if n := b.effects(t, ev.Key); n != 2 {
		t.Errorf("effects = %d, want 2 (one attempt's)", n)
	}
}

// TestDeferredOutsideProcess: Deferred means the same on every path that
// gives out a transaction (Exec queues and answers an empty tag, the queued
// statement is applied before the end), and only a transaction txhook did
// not begin runs it at once.
func TestDeferredOutsideProcess(t *testing.T) {
	t.Parallel()
	b := setup(t)
	queued := func(ctx context.Context, tx pgx.Tx, key string) error {
		tag, err := txhook.Deferred(tx).Exec(ctx, "INSERT INTO effects (event_key) VALUES ($1), ($1)", key)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 0 {
			t.Errorf("%s: rows affected = %d, want 0 (queued)", key, tag.RowsAffected())
		}
		return nil
	}
	if err := txhook.RunTx(t.Context(), b.pool, nil, func(ctx context.Context, tx pgx.Tx) error {
		return queued(ctx, tx, "run-tx")
	}); err != nil {
		t.Fatal(err)
	}
	if err := txhook.RunTx(t.Context(), b.pool, nil, func(ctx context.Context, tx pgx.Tx) error {
		return txhook.RunNestedTx(ctx, tx, func(ctx context.Context, tx pgx.Tx) error {
			return queued(ctx, tx, "nested")
		})
	}); err != nil {
		t.Fatal(err)
	}
	tx, err := b.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	tag, err := txhook.Deferred(tx).Exec(t.Context(), "INSERT INTO effects (event_key) VALUES ('own'), ('own')")
	if err != nil || tag.RowsAffected() != 2 {
		t.Errorf("own transaction: rows affected = %d, %v; want 2 (run at once)", tag.RowsAffected(), err)
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"run-tx", "nested", "own"} {
		if n := b.effects(t, key); n != 2 {
			t.Errorf("%s: %d effects, want 2", key, n)
		}
	}
}

// TestTransactionUnusableAfterProcess: a handler that keeps its transaction
// cannot send through it once Process has returned (its connection is back
// in the pool, perhaps in use elsewhere).
func TestTransactionUnusableAfterProcess(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, first := range []bool{false, true} {
		p := b.processor(t, &txhook.Config{DedupeWithFirstStatement: first})
		var kept pgx.Tx
		ev := event("evt_kept_" + map[bool]string{false: "a", true: "b"}[first])
		mustProcess(t, p, ev, func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
			kept = tx
			return writeThenDefer(ctx, tx, ev)
		}, txhook.OutcomeProcessed)
		if _, err := kept.Exec(t.Context(), "INSERT INTO effects (event_key) VALUES ('late')"); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("first=%v: Exec after Process = %v, want ErrTxClosed", first, err)
		}
		if _, err := txhook.Deferred(kept).Exec(t.Context(), "INSERT INTO effects (event_key) VALUES ('late')"); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("first=%v: deferred Exec after Process = %v, want ErrTxClosed", first, err)
		}
		if err := kept.QueryRow(t.Context(), "SELECT 1").Scan(new(int)); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("first=%v: QueryRow after Process = %v, want ErrTxClosed", first, err)
		}
	}
	if n := b.effects(t, "late"); n != 0 {
		t.Errorf("%d late effects", n)
	}
}

// TestDeferredNotSentIsNotLost: when the batch carrying deferred statements
// cannot be sent (pgx cannot encode the next statement's argument), the
// deferred statements are not applied, and a handler that ignores the
// error must not get its transaction committed without them.
func TestDeferredNotSentIsNotLost(t *testing.T) {
	t.Parallel()
	for _, first := range []bool{false, true} {
		b := setup(t)
		p := b.processor(t, &txhook.Config{DedupeWithFirstStatement: first})
		ev := event("evt_not_sent")
		res, err := p.Process(t.Context(), ev, func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
			if err := insertEffect(ctx, tx, ev); err != nil {
				return err
			}
			if err := deferNote(ctx, tx, ev.Key, "deferred"); err != nil {
				return err
			}
			_, _ = tx.Exec(ctx, "INSERT INTO effects (event_key) VALUES ($1)", make(chan int))
			return nil // ignores the failed statement
		})
		if err == nil || !strings.Contains(err.Error(), "deferred statement not applied") {
			t.Errorf("first=%v: Process = %+v, %v; want the deferred statement not applied", first, res, err)
		}
		if n := b.keys(t); n != 0 {
			t.Errorf("first=%v: %d keys committed", first, n)
		}
		if n := b.effects(t, ev.Key); n != 0 {
			t.Errorf("first=%v: %d effects committed", first, n)
		}
	}
}
