package txhook_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/internal/pgtrace"
)

// TestRecentKeysAnswerWithoutRoundTrip: a key this Processor processed is
// answered duplicate with nothing sent; a key another delivery committed,
// or one recorded as failed (an operator may replay it), still goes to the
// database, which answers duplicate.
func TestRecentKeysAnswerWithoutRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p, tr := tracedProcessor(t, b, nil)
	other := b.processor(t, nil)
	failing := func(context.Context, pgx.Tx, txhook.Event) error { return txhook.Permanent(errors.New("cannot apply")) }
	transient := func(context.Context, pgx.Tx, txhook.Event) error { return errors.New("try again") }

	mustProcess(t, p, event("evt_mine"), insertEffect, txhook.OutcomeProcessed)
	mustProcess(t, other, event("evt_theirs"), insertEffect, txhook.OutcomeProcessed)
	mustProcess(t, p, event("evt_theirs"), insertEffect, txhook.OutcomeDuplicate) // found in the database
	mustProcess(t, p, event("evt_failed"), failing, txhook.OutcomeFailed)
	if _, err := p.Process(t.Context(), event("evt_error"), transient); err == nil {
		t.Fatal("a handler error was not returned")
	}
	tr.Take()

	for _, key := range []string{"evt_mine", "evt_theirs", "evt_failed"} {
		calls := 0
		mustProcess(t, p, event(key), func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
			calls++
			return nil
		}, txhook.OutcomeDuplicate)
		got := tr.Take()
		if calls != 0 {
			t.Errorf("%s: handler calls %d, want none", key, calls)
		}
		if fromMemory := len(got) == 0; fromMemory != (key == "evt_mine") {
			t.Errorf("%s: round trips %q; want none only for the key this Processor processed", key, got)
		}
	}
	// An error settles nothing: the next delivery is processed.
	mustProcess(t, p, event("evt_error"), insertEffect, txhook.OutcomeProcessed)
	if got := tr.Take(); len(got) == 0 {
		t.Error("evt_error: answered without the database after an error")
	}
	if n := b.effects(t, "evt_mine") + b.effects(t, "evt_theirs") + b.effects(t, "evt_error"); n != 3 {
		t.Errorf("effects = %d, want 3", n)
	}
}

// TestRecentKeysInFlightIsNotRemembered: a key held by another delivery is
// answered in flight, and once that delivery rolls back, the next one is
// processed.
func TestRecentKeysInFlightIsNotRemembered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, &txhook.Config{LockTimeout: 50 * time.Millisecond})
	ev := event("evt_held")
	holder := holdKey(t, b.processor(t, nil), ev, true)
	mustProcess(t, p, ev, insertEffect, txhook.OutcomeInFlight)
	if err := holder.finish(t); err == nil {
		t.Fatal("the holder's error was not returned")
	}
	mustProcess(t, p, ev, insertEffect, txhook.OutcomeProcessed)
	if n := b.effects(t, ev.Key); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
}

// TestRecentKeysNotTaughtByProcessTx: ProcessTx commits nothing itself, so
// what it processed teaches the memory nothing: after the caller rolls its
// transaction back, the next Process of the key reaches the database and
// runs its handler, instead of being answered duplicate from memory.
func TestRecentKeysNotTaughtByProcessTx(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, nil)
	ctx := t.Context()
	ev := event("evt_tx_rolled_back")
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := p.ProcessTx(ctx, tx, ev, insertEffect); err != nil || res.Outcome != txhook.OutcomeProcessed {
		t.Fatalf("ProcessTx = %v, %v; want processed", res.Outcome, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	mustProcess(t, p, ev, insertEffect, txhook.OutcomeProcessed)
	if n := b.effects(t, ev.Key); n != 1 {
		t.Errorf("effects = %d, want 1: the event applied once, after the caller's rollback", n)
	}
}

// TestRecentKeysLimits: the memory forgets its oldest key past
// Config.RecentKeys, every key after Config.RecentKeysTTL and every key
// when told to (ForgetRecentKeys), and a negative RecentKeys turns it off.
func TestRecentKeysLimits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, tr := pgtrace.Pool(t, b.db.URL)
	sent := func(p *txhook.Processor, key string) bool {
		t.Helper()
		tr.Take()
		mustProcess(t, p, event(key), insertEffect, txhook.OutcomeDuplicate)
		return len(tr.Take()) > 0
	}
	newProc := func(cfg txhook.Config) *txhook.Processor {
		p, err := txhook.NewProcessor(pool, &cfg)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}

	two := newProc(txhook.Config{RecentKeys: 2})
	for _, k := range []string{"evt_l1", "evt_l2", "evt_l3"} {
		mustProcess(t, two, event(k), insertEffect, txhook.OutcomeProcessed)
	}
	if !sent(two, "evt_l1") {
		t.Error("the oldest of three keys was remembered with room for two")
	}
	if sent(two, "evt_l3") {
		t.Error("the newest key was not remembered")
	}

	short := newProc(txhook.Config{RecentKeysTTL: time.Millisecond})
	mustProcess(t, short, event("evt_ttl"), insertEffect, txhook.OutcomeProcessed)
	time.Sleep(5 * time.Millisecond)
	if !sent(short, "evt_ttl") {
		t.Error("a key was remembered past RecentKeysTTL")
	}

	forgetful := newProc(txhook.Config{})
	mustProcess(t, forgetful, event("evt_forgotten"), insertEffect, txhook.OutcomeProcessed)
	forgetful.ForgetRecentKeys()
	if !sent(forgetful, "evt_forgotten") {
		t.Error("a key was answered from memory after ForgetRecentKeys")
	}

	off := newProc(txhook.Config{RecentKeys: -1})
	mustProcess(t, off, event("evt_off"), insertEffect, txhook.OutcomeProcessed)
	if !sent(off, "evt_off") {
		t.Error("a key was remembered with RecentKeys < 0")
	}

	if _, err := txhook.NewProcessor(pool, &txhook.Config{RecentKeysTTL: -time.Second}); err == nil {
		t.Error("a negative RecentKeysTTL was accepted")
	}
}
