package txhook_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
)

// TestMemoryHitsDoNotTurnOnTheRead: redeliveries answered from memory reach
// no database and are not counted as the database's duplicates, so a storm
// the memory absorbs does not make the next new event pay for a read.
func TestMemoryHitsDoNotTurnOnTheRead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p, tr := tracedProcessor(t, b, nil)
	mustProcess(t, p, event("evt_absorbed"), insertEffect, txhook.OutcomeProcessed)
	tr.Take()
	for range 50 {
		mustProcess(t, p, event("evt_absorbed"), insertEffect, txhook.OutcomeDuplicate)
	}
	if got := tr.Take(); len(got) != 0 {
		t.Fatalf("redeliveries of a key this Processor processed: round trips %q, want none", got)
	}
	mustProcess(t, p, event("evt_next_new"), insertEffect, txhook.OutcomeProcessed)
	wantTrips(t, tr, "a new event after a storm the memory absorbed", [][]string{
		{"begin", "InsertEvent"}, {insertEffectSQL}, {"commit"},
	})
}

// TestReplayedLeaseKeyIsNotAnsweredFromMemory: a key recorded as failed and
// then claimed again by a replay is in flight, as the database says;
// the Processor that saw it failed does not answer it duplicate.
func TestReplayedLeaseKeyIsNotAnsweredFromMemory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ev := event("evt_lease_replayed")
	entered, release := make(chan struct{}), make(chan struct{})
	rs := txhook.NewRoutes()
	rs.Lease(ev.Source, ev.Type, txhook.LeaseHandler{ // the replay's
		Lease: time.Minute,
		Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
			close(entered)
			select {
			case <-release:
			case <-time.After(30 * time.Second):
			}
			return func(ctx context.Context, tx pgx.Tx) error { return insertEffect(ctx, tx, ev) }, nil
		},
	})
	p := b.processor(t, &txhook.Config{Routes: rs})
	failing := txhook.LeaseHandler{Work: func(context.Context, txhook.Claim, txhook.Event) (txhook.TxFunc, error) {
		return nil, txhook.Permanent(errors.New("cannot apply"))
	}}
	if res, err := p.ProcessLease(t.Context(), ev, failing); err != nil || res.Outcome != txhook.OutcomeFailed {
		t.Fatalf("lease delivery: %v, %v; want failed", res.Outcome, err)
	}
	mustProcess(t, p, ev, insertEffect, txhook.OutcomeDuplicate) // the database: failed

	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	replayed := make(chan error, 1)
	go func() {
		_, err := p.Replay(context.Background(), ev.Source, ev.Key)
		replayed <- err
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the replay did not claim the event")
	}
	mustProcess(t, p, ev, insertEffect, txhook.OutcomeInFlight)
	close(release)
	select {
	case err := <-replayed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the replay did not finish")
	}
	mustProcess(t, p, ev, insertEffect, txhook.OutcomeDuplicate)
	if n := b.effects(t, ev.Key); n != 1 {
		t.Errorf("effects = %d, want the replay's 1", n)
	}
}
