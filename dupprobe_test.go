package txhook_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/db"
	"github.com/txhook/txhook/internal/pgtrace"
)

// storm redelivers ev until the processor reads before its transactions:
// 11 duplicates in a row pass the one-half mark (see dupShare).
func storm(t *testing.T, p *txhook.Processor, ev txhook.Event) {
	t.Helper()
	for range 12 {
		mustProcess(t, p, ev, insertEffect, txhook.OutcomeDuplicate)
	}
}

func TestDuplicateStormIsAnsweredWithOneRead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p, tr := tracedProcessor(t, b, noMemory)
	ev := event("evt_storm")
	mustProcess(t, p, ev, insertEffect, txhook.OutcomeProcessed)
	storm(t, p, ev)
	tr.Take()

	steps := []struct {
		name string
		ev   txhook.Event
		want txhook.Outcome
		sent [][]string
	}{
		{"duplicate in a storm", ev, txhook.OutcomeDuplicate, [][]string{{"EventStatus"}}},
		{"new event in a storm", event("evt_new_in_storm"), txhook.OutcomeProcessed, [][]string{
			{"EventStatus"},
			{"begin", "InsertEvent"},
			{"insert into effects (event_key) values ($1)"},
			{"commit"},
		}},
	}
	for _, s := range steps {
		mustProcess(t, p, s.ev, insertEffect, s.want)
		if got := tr.Take(); !slices.EqualFunc(got, s.sent, slices.Equal) {
			t.Errorf("%s: round trips %q, want %q", s.name, got, s.sent)
		}
	}
	// New events end the storm: the read stops within a dozen of them.
	for i := range 12 {
		mustProcess(t, p, event("evt_after_storm_"+string(rune('a'+i))), insertEffect, txhook.OutcomeProcessed)
	}
	tr.Take()
	mustProcess(t, p, ev, insertEffect, txhook.OutcomeDuplicate)
	// The dedupe step finds the key recorded; the read of a claim holding
	// it follows the rollback.
	want := [][]string{{"begin", "InsertEvent"}, {"rollback"}, {"InFlightLease"}}
	if got := tr.Take(); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("duplicate after the storm: round trips %q, want %q", got, want)
	}
	if n := b.effects(t, ev.Key); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
}

// TestReadDuringStormDecidesOnlyDuplicates: while the processor reads first,
// keys that are not settled (held by an uncommitted delivery, claimed in
// lease mode, or new) still go through the transaction's dedupe step, and a
// failed key is a duplicate as it is without the read.
func TestReadDuringStormDecidesOnlyDuplicates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, &txhook.Config{LockTimeout: 100 * time.Millisecond, RecentKeys: -1})
	seed := event("evt_seed")
	mustProcess(t, p, seed, insertEffect, txhook.OutcomeProcessed)

	// Held by an uncommitted delivery on another processor.
	held := event("evt_held")
	first := holdKey(t, b.processor(t, nil), held, false)
	storm(t, p, seed)
	mustProcess(t, p, held, insertEffect, txhook.OutcomeInFlight)
	if err := first.finish(t); err != nil {
		t.Fatal(err)
	}
	storm(t, p, seed)
	mustProcess(t, p, held, insertEffect, txhook.OutcomeDuplicate)

	// Claimed in lease mode by a worker still running.
	claimed := event("evt_claimed")
	working := make(chan struct{})
	finish := newReleased(t)
	leaseDone := make(chan error, 1)
	go func() {
		_, err := p.ProcessLease(context.Background(), claimed, txhook.LeaseHandler{
			Lease: time.Minute,
			Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
				close(working)
				<-finish.ch
				return nil, nil
			},
		})
		leaseDone <- err
	}()
	select {
	case <-working:
	case err := <-leaseDone:
		t.Fatalf("lease-mode delivery ended before its work: %v", err)
	case <-time.After(waitBound):
		t.Fatal("lease-mode delivery did not start its work")
	}
	storm(t, p, seed)
	res := mustProcess(t, p, claimed, insertEffect, txhook.OutcomeInFlight)
	if res.RetryAfter < 30*time.Second {
		t.Errorf("RetryAfter = %v, want the lease's remaining time", res.RetryAfter)
	}
	finish.free()
	select {
	case err := <-leaseDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(waitBound):
		t.Fatal("lease-mode delivery did not finish")
	}

	// Recorded as failed: a duplicate, handler not run.
	failed := event("evt_failed")
	if _, err := p.Process(t.Context(), failed, func(context.Context, pgx.Tx, txhook.Event) error {
		return txhook.Permanent(errors.New("cannot apply"))
	}); err != nil {
		t.Fatal(err)
	}
	storm(t, p, seed)
	mustProcess(t, p, failed, func(context.Context, pgx.Tx, txhook.Event) error {
		t.Error("handler ran for a failed key")
		return nil
	}, txhook.OutcomeDuplicate)

	// New: processed once.
	storm(t, p, seed)
	fresh := event("evt_fresh")
	mustProcess(t, p, fresh, insertEffect, txhook.OutcomeProcessed)
	if n := b.effects(t, fresh.Key) + b.effects(t, held.Key) + b.effects(t, seed.Key); n != 3 {
		t.Errorf("effects = %d, want 3", n)
	}
}

// TestStormReadDoesNotRememberFailedKeys: with the memory on, a dead
// letter's redeliveries in a storm are answered duplicate by the read, and
// the read does not teach the memory the failed key: once an operator
// discards the dead letter, the sender's next redelivery reaches the
// database and is processed.
func TestStormReadDoesNotRememberFailedKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p, tr := tracedProcessor(t, b, nil)
	ev := event("evt_dead_in_storm")
	mustProcess(t, p, ev, func(context.Context, pgx.Tx, txhook.Event) error {
		return txhook.Permanent(errors.New("cannot apply yet"))
	}, txhook.OutcomeFailed)
	storm(t, p, ev) // the memory holds no failed key: each is the database's duplicate
	tr.Take()
	mustProcess(t, p, ev, insertEffect, txhook.OutcomeDuplicate)
	if got, want := tr.Take(), [][]string{{"EventStatus"}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("dead letter in a storm: round trips %q, want %q (the read)", got, want)
	}

	n, err := db.New(b.pool).AdminDiscardFailed(t.Context(), db.AdminDiscardFailedParams{Source: ev.Source, EventKey: ev.Key})
	if err != nil || n != 1 {
		t.Fatalf("discard = %d, %v; want 1 row", n, err)
	}
	mustProcess(t, p, ev, insertEffect, txhook.OutcomeProcessed)
	if n := b.effects(t, ev.Key); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
}

// TestReadErrorDuringStormIsAnError: when the read itself fails, Process
// reports the error; it never answers duplicate for a key it could not read.
func TestReadErrorDuringStormIsAnError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, err := pgxpool.New(t.Context(), b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	p, err := txhook.NewProcessor(pool, noMemory)
	if err != nil {
		t.Fatal(err)
	}
	ev := event("evt_read_error")
	mustProcess(t, p, ev, insertEffect, txhook.OutcomeProcessed)
	storm(t, p, ev)
	pool.Close() // the database can no longer be reached through p
	res, err := p.Process(t.Context(), ev, insertEffect)
	if err == nil || !strings.Contains(err.Error(), "look up event key") {
		t.Fatalf("process with the database gone: %v, %v; want the read's error", res.Outcome, err)
	}
	if res.Outcome != 0 {
		t.Errorf("outcome %v with an error, want none", res.Outcome)
	}
}

// wrappedPool is a wrapper around a pool with all of pgx's statement
// methods (as tracing wrappers have): BEGIN gets a round trip of its own,
// but statements run directly, so the storm read and lease mode's claim
// need no transaction.
type wrappedPool struct{ *pgxpool.Pool }

// beginOnly wraps a database that can only begin transactions.
type beginOnly struct{ d txhook.Beginner }

func (b beginOnly) BeginTx(ctx context.Context, o pgx.TxOptions) (pgx.Tx, error) {
	return b.d.BeginTx(ctx, o)
}

// TestWrappedDatabases checks what a Processor on a Beginner other than a
// pool or connection sends: a plain BEGIN, the storm read only when the
// wrapper runs statements directly, and lease mode's claim in a transaction
// of its own otherwise.
func TestWrappedDatabases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, tr := pgtrace.Pool(t, b.db.URL)
	lease := txhook.LeaseHandler{
		Lease: 10 * time.Second,
		Work: func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
			return func(ctx context.Context, tx pgx.Tx) error { return insertEffect(ctx, tx, ev) }, nil
		},
	}
	cases := []struct {
		name      string
		db        txhook.Beginner
		stormDup  [][]string
		leaseSent [][]string
	}{
		{"wrapper with statements", wrappedPool{pool},
			[][]string{{"EventStatus"}},
			[][]string{{"ClaimEvent"}, {"begin"}, {"CompleteLease"}, {"insert into effects (event_key) values ($1)"}, {"commit"}}},
		{"begin only", beginOnly{pool},
			[][]string{{"begin"}, {"InsertEvent"}, {"rollback"}, {"begin"}, {"InFlightLease"}, {"rollback"}},
			[][]string{{"begin"}, {"ClaimEvent"}, {"commit"}, {"begin"}, {"CompleteLease"}, {"insert into effects (event_key) values ($1)"}, {"commit"}}},
	}
	for _, c := range cases {
		p, err := txhook.NewProcessor(c.db, noMemory)
		if err != nil {
			t.Fatal(err)
		}
		key := "evt_wrapped_" + strings.ReplaceAll(c.name, " ", "_")
		tr.Take()
		mustProcess(t, p, event(key), insertEffect, txhook.OutcomeProcessed)
		want := [][]string{{"begin"}, {"InsertEvent"}, {"insert into effects (event_key) values ($1)"}, {"commit"}}
		if got := tr.Take(); !slices.EqualFunc(got, want, slices.Equal) {
			t.Errorf("%s: new event: round trips %q, want %q", c.name, got, want)
		}
		storm(t, p, event(key))
		tr.Take()
		mustProcess(t, p, event(key), insertEffect, txhook.OutcomeDuplicate)
		if got := tr.Take(); !slices.EqualFunc(got, c.stormDup, slices.Equal) {
			t.Errorf("%s: duplicate in a storm: round trips %q, want %q", c.name, got, c.stormDup)
		}

		// A fresh processor (no storm) in lease mode.
		p, err = txhook.NewProcessor(c.db, noMemory)
		if err != nil {
			t.Fatal(err)
		}
		res, err := p.ProcessLease(t.Context(), event(key+"_lease"), lease)
		if err != nil || res.Outcome != txhook.OutcomeProcessed {
			t.Fatalf("%s: process lease: %v, %v", c.name, res.Outcome, err)
		}
		if got := tr.Take(); !slices.EqualFunc(got, c.leaseSent, slices.Equal) {
			t.Errorf("%s: lease mode: round trips %q, want %q", c.name, got, c.leaseSent)
		}
		for _, k := range []string{key, key + "_lease"} {
			if n := b.effects(t, k); n != 1 {
				t.Errorf("%s: effects of %s = %d, want 1", c.name, k, n)
			}
		}
	}
}
