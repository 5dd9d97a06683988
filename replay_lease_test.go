package txhook_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
)

// A failed lease-mode event is replayed through its lease handler: a new
// claim runs the external work again and commits the business write with
// the done mark; a second replay is a duplicate.
func TestReplayLeaseModeEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ev := event("evt_lease_failed")
	ev.Type = "payment_intent.succeeded"

	var calls []string // idempotency keys of the external calls
	fail := true
	lh := txhook.LeaseHandler{Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
		calls = append(calls, c.IdempotencyKey("ship"))
		if fail {
			return nil, txhook.Permanent(errors.New("carrier refused the address"))
		}
		return func(ctx context.Context, tx pgx.Tx) error { return insertEffect(ctx, tx, ev) }, nil
	}}
	rs := txhook.NewRoutes()
	rs.Lease(ev.Source, ev.Type, lh)
	p := b.processor(t, &txhook.Config{StorePayload: true, Routes: rs})
	res, err := p.Deliver(t.Context(), ev, nil)
	if err != nil || res.Outcome != txhook.OutcomeFailed {
		t.Fatalf("Deliver = %v, %v; want failed", res.Outcome, err)
	}
	r := p
	fail = false
	if res, err := r.Replay(t.Context(), ev.Source, ev.Key); err != nil || res.Outcome != txhook.OutcomeProcessed {
		t.Fatalf("Replay = %v, %v; want processed", res.Outcome, err)
	}
	if res, err := r.Replay(t.Context(), ev.Source, ev.Key); err != nil || res.Outcome != txhook.OutcomeDuplicate {
		t.Fatalf("second Replay = %v, %v; want duplicate", res.Outcome, err)
	}
	if n := b.effects(t, ev.Key); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
	if len(calls) != 2 || calls[0] != calls[1] {
		t.Errorf("external calls = %v, want two with the same idempotency key", calls)
	}
}

// A lease-mode replay whose handler fails with an error that is not
// permanent, in phase one or in phase two, returns the error and leaves the
// event failed with the new error and its payload, still a dead letter: a
// later replay runs it.
func TestReplayLeaseTransientErrorKeepsDeadLetter(t *testing.T) {
	t.Parallel()
	for _, phase := range []string{"work", "commit"} {
		t.Run(phase, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ev := event("evt_lease_replay_" + phase)
			errUpstream := errors.New("carrier API answered 503")
			mode := "permanent"
			lh := txhook.LeaseHandler{Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
				switch {
				case mode == "permanent":
					return nil, txhook.Permanent(errors.New("carrier refused the address"))
				case mode == "transient" && phase == "work":
					return nil, errUpstream
				case mode == "transient":
					return func(ctx context.Context, tx pgx.Tx) error {
						if err := insertEffect(ctx, tx, ev); err != nil {
							return err
						}
						return errUpstream
					}, nil
				}
				return func(ctx context.Context, tx pgx.Tx) error { return insertEffect(ctx, tx, ev) }, nil
			}}
			rs := txhook.NewRoutes()
			rs.Lease(ev.Source, ev.Type, lh)
			p := b.processor(t, &txhook.Config{StorePayload: true, Routes: rs})
			if res, err := p.ProcessLease(t.Context(), ev, lh); err != nil || res.Outcome != txhook.OutcomeFailed {
				t.Fatalf("ProcessLease = %v, %v; want failed", res.Outcome, err)
			}
			r := p

			mode = "transient"
			if _, err := r.Replay(t.Context(), ev.Source, ev.Key); !errors.Is(err, errUpstream) || errors.Is(err, txhook.ErrLeaseLost) {
				t.Fatalf("Replay error = %v, want the handler's error", err)
			}
			rec, err := txhook.GetEventRecord(t.Context(), b.pool, ev.Source, ev.Key)
			if err != nil {
				t.Fatal(err)
			}
			if rec.Status != txhook.StatusFailed || rec.Attempts != 2 || !rec.LeaseExpiresAt.IsZero() ||
				rec.CompletedAt.IsZero() || !strings.Contains(rec.LastError, "carrier API answered 503") ||
				string(rec.Payload) != string(ev.Payload) {
				t.Errorf("row after the failed replay = %+v, want failed, attempt 2, the new error and the payload", rec)
			}
			dead, err := txhook.ListDeadLetters(t.Context(), b.pool, txhook.EventFilter{})
			if err != nil {
				t.Fatal(err)
			}
			if len(dead) != 1 || dead[0].Key != ev.Key {
				t.Errorf("dead letters = %+v, want the event", dead)
			}
			if n := b.effects(t, ev.Key); n != 0 {
				t.Errorf("effects = %d after the failed replay, want 0", n)
			}

			mode = "ok"
			if res, err := r.Replay(t.Context(), ev.Source, ev.Key); err != nil || res.Outcome != txhook.OutcomeProcessed {
				t.Fatalf("second Replay = %v, %v; want processed", res.Outcome, err)
			}
			if n := b.effects(t, ev.Key); n != 1 {
				t.Errorf("effects = %d, want 1", n)
			}
		})
	}
}

// A lease-mode event left in progress with its claim released (the handler
// failed with a transient error and the sender never retried) is not a dead
// letter, but a replay through its lease route takes its claim over and
// applies it once; a live claim is answered in flight, and nothing runs.
func TestReplayTakesOverAbandonedLeaseClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ev := event("evt_lease_abandoned")
	fail := true
	var runs int
	lh := txhook.LeaseHandler{Lease: time.Minute, Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
		runs++
		if fail {
			return nil, errors.New("carrier API answered 503")
		}
		return func(ctx context.Context, tx pgx.Tx) error { return insertEffect(ctx, tx, ev) }, nil
	}}
	rs := txhook.NewRoutes()
	rs.Lease(ev.Source, ev.Type, lh)
	p := b.processor(t, &txhook.Config{StorePayload: true, Routes: rs})
	if _, err := p.ProcessLease(t.Context(), ev, lh); err == nil {
		t.Fatal("ProcessLease succeeded, want the handler's error")
	}
	r := p

	// A live claim: held by another delivery.
	if _, err := b.pool.Exec(t.Context(), `UPDATE txhook_processed_events SET lease_expires_at = now() + interval '1 minute'
		WHERE event_key = $1`, ev.Key); err != nil {
		t.Fatal(err)
	}
	runs = 0
	if res, err := r.Replay(t.Context(), ev.Source, ev.Key); err != nil || res.Outcome != txhook.OutcomeInFlight || runs != 0 {
		t.Fatalf("Replay of a live claim = %v, %v, handler runs %d; want in flight, none", res.Outcome, err, runs)
	}

	// Abandoned: the lease has ended.
	if _, err := b.pool.Exec(t.Context(), `UPDATE txhook_processed_events SET lease_expires_at = now() - interval '1 second'
		WHERE event_key = $1`, ev.Key); err != nil {
		t.Fatal(err)
	}
	fail = false
	if res, err := r.Replay(t.Context(), ev.Source, ev.Key); err != nil || res.Outcome != txhook.OutcomeProcessed {
		t.Fatalf("Replay of an abandoned claim = %v, %v; want processed", res.Outcome, err)
	}
	if n := b.effects(t, ev.Key); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
	rec, err := txhook.GetEventRecord(t.Context(), b.pool, ev.Source, ev.Key)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != txhook.StatusDone || rec.Attempts != 2 {
		t.Errorf("row = %s, attempt %d; want done under the second token", rec.Status, rec.Attempts)
	}
	if res, err := r.Replay(t.Context(), ev.Source, ev.Key); err != nil || res.Outcome != txhook.OutcomeDuplicate {
		t.Errorf("Replay once done = %v, %v; want duplicate", res.Outcome, err)
	}
}
