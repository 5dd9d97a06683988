package txhook_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/internal/testdb"
)

// replayBundle is a database with one failed event, "test"/"evt_failed", and
// an effects table for the replay's handler.
type replayBundle struct {
	d *testdb.DB
}

func setupReplay(t *testing.T, storePayload bool) *replayBundle {
	t.Helper()
	d := testdb.New(t)
	if _, err := d.Pool.Exec(t.Context(), "CREATE TABLE replay_effects (event_key text NOT NULL, payload text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	p, err := txhook.NewProcessor(d.Pool, &txhook.Config{StorePayload: storePayload})
	if err != nil {
		t.Fatal(err)
	}
	ev := txhook.Event{Source: "test", Key: "evt_failed", Type: "invoice.paid", Payload: []byte(`{"id":"evt_failed"}`)}
	res, err := p.Process(t.Context(), ev, func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		return txhook.Permanent(errors.New("unknown account"))
	})
	if err != nil || res.Outcome != txhook.OutcomeFailed {
		t.Fatalf("process: %v %v, want failed", res.Outcome, err)
	}
	return &replayBundle{d: d}
}

// record applies an event: one effect row with its payload.
func record(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
	_, err := tx.Exec(ctx, "INSERT INTO replay_effects (event_key, payload) VALUES ($1, $2)", ev.Key, string(ev.Payload))
	return err
}

// replayer is a Processor whose one route, test/invoice.paid, runs h.
func (b *replayBundle) replayer(t *testing.T, h txhook.HandlerFunc) *txhook.Processor {
	t.Helper()
	rs := txhook.NewRoutes()
	rs.Transactional("test", "invoice.paid", h)
	p, err := txhook.NewProcessor(b.d.Pool, &txhook.Config{Routes: rs})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (b *replayBundle) effects(t *testing.T) int {
	t.Helper()
	var n int
	if err := b.d.Pool.QueryRow(t.Context(), "SELECT count(*) FROM replay_effects").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (b *replayBundle) event(t *testing.T, key string) txhook.EventRecord {
	t.Helper()
	rec, err := txhook.GetEventRecord(t.Context(), b.d.Pool, "test", key)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func TestReplayFailedEvent(t *testing.T) {
	t.Parallel()
	b := setupReplay(t, true)
	before := b.event(t, "evt_failed")
	if before.Status != txhook.StatusFailed || before.Attempts != 1 || !strings.Contains(before.LastError, "unknown account") {
		t.Fatalf("before replay: %+v", before)
	}
	r := b.replayer(t, record)

	res, err := r.Replay(t.Context(), "test", "evt_failed")
	if err != nil || res.Outcome != txhook.OutcomeProcessed {
		t.Fatalf("replay: %v %v, want processed", res.Outcome, err)
	}
	after := b.event(t, "evt_failed")
	if after.Status != txhook.StatusDone || after.Attempts != 2 || after.LastError != "" || !after.CompletedAt.After(before.CompletedAt) {
		t.Errorf("after replay: %+v, want done, 2 attempts, no error, later completion", after)
	}
	var payload string
	if err := b.d.Pool.QueryRow(t.Context(), "SELECT payload FROM replay_effects WHERE event_key = 'evt_failed'").Scan(&payload); err != nil {
		t.Fatal(err)
	}
	if payload != `{"id":"evt_failed"}` {
		t.Errorf("handler saw payload %q", payload)
	}

	res, err = r.Replay(t.Context(), "test", "evt_failed")
	if err != nil || res.Outcome != txhook.OutcomeDuplicate {
		t.Errorf("second replay: %v %v, want duplicate", res.Outcome, err)
	}
	if n := b.effects(t); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
}

func TestConcurrentReplaysRunHandlerOnce(t *testing.T) {
	t.Parallel()
	b := setupReplay(t, true)
	var calls atomic.Int32
	r := b.replayer(t, func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		calls.Add(1)
		time.Sleep(100 * time.Millisecond) // hold the row while the others arrive
		return record(ctx, tx, ev)
	})
	const n = 8
	outcomes := make([]txhook.Outcome, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			res, err := r.Replay(t.Context(), "test", "evt_failed")
			if err != nil {
				t.Errorf("replay %d: %v", i, err)
			}
			outcomes[i] = res.Outcome
		})
	}
	wg.Wait()
	processed := 0
	for _, o := range outcomes {
		switch o {
		case txhook.OutcomeProcessed:
			processed++
		case txhook.OutcomeDuplicate:
		default:
			t.Errorf("outcome %v, want processed or duplicate", o)
		}
	}
	if processed != 1 || calls.Load() != 1 || b.effects(t) != 1 {
		t.Errorf("processed %d times, handler ran %d times, %d effects; want 1 each", processed, calls.Load(), b.effects(t))
	}
}

func TestReplayFailingPermanentlyAgainStaysFailed(t *testing.T) {
	t.Parallel()
	b := setupReplay(t, true)
	r := b.replayer(t, func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		if err := record(ctx, tx, ev); err != nil {
			return err
		}
		return txhook.Permanent(errors.New("account still unknown"))
	})
	res, err := r.Replay(t.Context(), "test", "evt_failed")
	if err != nil || res.Outcome != txhook.OutcomeFailed || res.Err == nil {
		t.Fatalf("replay: %+v %v, want failed with its error", res, err)
	}
	rec := b.event(t, "evt_failed")
	if rec.Status != txhook.StatusFailed || rec.Attempts != 2 || !strings.Contains(rec.LastError, "account still unknown") {
		t.Errorf("after failed replay: %+v, want failed, 2 attempts, new error", rec)
	}
	if n := b.effects(t); n != 0 {
		t.Errorf("effects = %d, want the handler's write rolled back", n)
	}
}

func TestReplayTransientErrorChangesNothing(t *testing.T) {
	t.Parallel()
	b := setupReplay(t, true)
	before := b.event(t, "evt_failed")
	boom := errors.New("downstream unavailable")
	r := b.replayer(t, func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		if err := record(ctx, tx, ev); err != nil {
			return err
		}
		return boom
	})
	if _, err := r.Replay(t.Context(), "test", "evt_failed"); !errors.Is(err, boom) {
		t.Fatalf("replay error = %v, want the handler's error", err)
	}
	after := b.event(t, "evt_failed")
	if after.Status != before.Status || after.Attempts != before.Attempts || after.LastError != before.LastError || !after.CompletedAt.Equal(before.CompletedAt) {
		t.Errorf("row changed by a transient failure: %+v -> %+v", before, after)
	}
	if n := b.effects(t); n != 0 {
		t.Errorf("effects = %d, want 0", n)
	}
}

func TestReplayWithoutPayloadFails(t *testing.T) {
	t.Parallel()
	b := setupReplay(t, false)
	// A failed event keeps its payload even without StorePayload, so that
	// the dead letter can be replayed; a row without one (written before
	// that, or by hand) cannot be.
	if b.event(t, "evt_failed").Payload == nil {
		t.Fatal("a failed event's payload was not stored under the default configuration")
	}
	if _, err := b.d.Pool.Exec(t.Context(), "UPDATE txhook_processed_events SET payload = NULL WHERE event_key = 'evt_failed'"); err != nil {
		t.Fatal(err)
	}
	calls := 0
	r := b.replayer(t, func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		calls++
		return nil
	})
	_, err := r.Replay(t.Context(), "test", "evt_failed")
	if !errors.Is(err, txhook.ErrNoPayload) {
		t.Fatalf("replay error = %v, want ErrNoPayload", err)
	}
	if calls != 0 || b.event(t, "evt_failed").Status != txhook.StatusFailed {
		t.Errorf("handler ran %d times or the row changed", calls)
	}
}

func TestReplayRefusals(t *testing.T) {
	t.Parallel()
	b := setupReplay(t, true)
	opsSeed(t, b.d.Pool, "in_progress", "stuck-", 1, time.Minute)
	if _, err := b.d.Pool.Exec(t.Context(), `INSERT INTO txhook_processed_events
		(source, event_key, event_type, status, completed_at, last_error, payload)
		VALUES ('test', 'evt_other_type', 'customer.created', 'failed', now(), 'boom', '\x7b7d')`); err != nil {
		t.Fatal(err)
	}
	r := b.replayer(t, record)
	for key, want := range map[string]error{
		"evt_missing":    txhook.ErrEventNotFound,
		"stuck-1":        txhook.ErrNotFailed,
		"evt_other_type": txhook.ErrNoHandler,
	} {
		if _, err := r.Replay(t.Context(), "test", key); !errors.Is(err, want) {
			t.Errorf("replay %s: error %v, want %v", key, err, want)
		}
	}
	if n := b.effects(t); n != 0 {
		t.Errorf("effects = %d, want 0", n)
	}
}

func TestReplayFailedSelectsAndReports(t *testing.T) {
	t.Parallel()
	b := setupReplay(t, true)
	opsSeed(t, b.d.Pool, "failed", "more-", 3, time.Hour) // type thing.happened: no handler
	if _, err := b.d.Pool.Exec(t.Context(), `INSERT INTO txhook_processed_events
		(source, event_key, event_type, status, completed_at, last_error, payload)
		VALUES ('other', 'evt_elsewhere', 'invoice.paid', 'failed', now(), 'boom', '\x7b7d')`); err != nil {
		t.Fatal(err)
	}
	r := b.replayer(t, record)

	reports, err := r.ReplayFailed(t.Context(), txhook.EventFilter{Source: "test"})
	if err != nil {
		t.Fatal(err)
	}
	// Oldest first: the three seeded an hour ago, then evt_failed.
	var got []string
	for _, rep := range reports {
		switch {
		case rep.Err != nil && errors.Is(rep.Err, txhook.ErrNoHandler):
			got = append(got, rep.Key+":no handler")
		case rep.Err != nil:
			got = append(got, rep.Key+":"+rep.Err.Error())
		default:
			got = append(got, rep.Key+":"+rep.Result.Outcome.String())
		}
	}
	want := "more-1:no handler more-2:no handler more-3:no handler evt_failed:processed"
	if strings.Join(got, " ") != want {
		t.Errorf("reports = %v, want %s", got, want)
	}
	if rec, err := txhook.GetEventRecord(t.Context(), b.d.Pool, "other", "evt_elsewhere"); err != nil || rec.Status != txhook.StatusFailed {
		t.Errorf("event of another source: %+v %v, want untouched", rec, err)
	}

	left, err := txhook.ListDeadLetters(t.Context(), b.d.Pool, txhook.EventFilter{Type: "thing.happened", Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 2 || left[0].Key != "more-1" || left[0].LastError != "permanent: boom" || left[0].Attempts != 1 || !left[0].HasPayload {
		t.Errorf("dead letters = %+v, want more-1 and more-2 with error, attempts and payload", left)
	}
}
