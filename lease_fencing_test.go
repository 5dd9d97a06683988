package txhook_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/db"
)

// TestLeaseStaleWorkerFencedDuringTakeover: a worker whose lease ran out
// ignores its cancelled context and ends its work while the delivery that
// took the event over is still running its own phase one. Only the fencing
// token tells the two claims apart then (the row is in progress for both),
// and every write the stale worker makes must be rejected: the release or
// failure record that follows an error of its phase one, and in phase two
// the done mark, its business writes, and the release or failure record
// that follows an error. The newer claim stays untouched and completes.
func TestLeaseStaleWorkerFencedDuringTakeover(t *testing.T) {
	t.Parallel()
	for _, tc := range staleEndings() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := leaseSetup(t)
			ev := leaseEvent("evt_fenced")

			// The stale worker: a short lease, no renewal, and work that
			// carries on after its context ends (a call already on the wire,
			// a long pause).
			staleWork := tc.work(b)
			stale := b.startBlocked(t, ev, txhook.LeaseHandler{Lease: 200 * time.Millisecond, RenewEvery: -1, Work: staleWork}, false)
			if c := stale.claim(t); c.Token != 1 {
				t.Fatalf("stale worker's token = %d, want 1", c.Token)
			}

			// The new owner takes the event over once the lease has run out,
			// and stays in phase one.
			var owner *blocked
			var ownerClaim txhook.Claim
			until(t, "a takeover", func() bool {
				owner = b.startBlocked(t, ev, txhook.LeaseHandler{Lease: time.Minute, Work: b.chargeAndRecord("owner")}, false)
				select {
				case ownerClaim = <-owner.started:
					return true
				case <-owner.done:
					if owner.err != nil || owner.res.Outcome != txhook.OutcomeInFlight {
						t.Fatalf("takeover delivery = %v, %v; want in flight or a claim", owner.res, owner.err)
					}
					return false
				case <-time.After(waitBound):
					t.Fatal("takeover delivery neither claimed nor ended")
					return false
				}
			})
			if ownerClaim.Token != 2 {
				t.Fatalf("new owner's token = %d, want 2", ownerClaim.Token)
			}
			claimed := b.row(t, ev.Key)

			// The stale worker wakes up and runs phase two to the end while
			// the new owner holds the event.
			stale.finish(t)
			tc.wantLost(t, stale)
			if got := b.effects(t, ev.Key); len(got) != 0 {
				t.Errorf("effects = %v after the stale worker's phase two, want none", got)
			}
			wantSameClaim(t, b.row(t, ev.Key), claimed)
			// The new owner's claim still holds the event for its whole lease.
			res := b.mustLease(t, ev, txhook.LeaseHandler{Work: b.chargeAndRecord("third")}, txhook.OutcomeInFlight)
			if res.RetryAfter < 30*time.Second {
				t.Errorf("RetryAfter = %v, want what is left of the new owner's 1m lease", res.RetryAfter)
			}
			tres, err := b.p.Process(t.Context(), ev, func(context.Context, pgx.Tx, txhook.Event) error {
				t.Error("a transactional handler ran while the new owner held the event")
				return nil
			})
			if err != nil || tres.Outcome != txhook.OutcomeInFlight {
				t.Errorf("transactional delivery = %v, %v; want in flight", tres, err)
			}

			owner.finish(t)
			if owner.err != nil || owner.res.Outcome != txhook.OutcomeProcessed {
				t.Fatalf("new owner = %v, %v; want processed", owner.res, owner.err)
			}
			if got := b.effects(t, ev.Key); len(got) != 1 || got[0] != "owner" {
				t.Errorf("effects = %v, want the new owner's only", got)
			}
			if r := b.row(t, ev.Key); r.Status != "done" || r.Attempts != 2 || r.LastError.Valid {
				t.Errorf("row = %+v, want done by attempt 2 with no error", r)
			}
			b.api.wantCalls(t, txhook.IdempotencyKey("test", ev.Key, "charge"), 2)
		})
	}
}

// wantSameClaim fails t unless got is still the claim want: in progress,
// same token, same lease, no error recorded.
func wantSameClaim(t *testing.T, got, want db.TxhookProcessedEvent) {
	t.Helper()
	if got.Status != "in_progress" || got.Attempts != want.Attempts || got.LeaseExpiresAt != want.LeaseExpiresAt ||
		got.CompletedAt.Valid || got.LastError != want.LastError {
		t.Errorf("row = status %s, attempts %d, lease until %v, completed %v, last error %q;\nwant the new claim untouched: in progress, attempts %d, lease until %v, no error",
			got.Status, got.Attempts, got.LeaseExpiresAt.Time, got.CompletedAt.Valid, got.LastError.String,
			want.Attempts, want.LeaseExpiresAt.Time)
	}
}

// TestLeaseStaleWorkerFencedAfterDiscard: the token starts again at 1 when
// the row is deleted. A worker claims an event (token 1) and stalls past its
// lease; another takes it over (token 2) and fails for good; an operator
// discards the dead letter (the console's delete); a new delivery claims the
// key afresh, with token 1 again. Whatever the stale worker does then (an
// error or a permanent one in phase one, or phase two to its end), its
// phase two, its release and its failure record must all miss the new
// claim, although the token matches: nothing of it commits, and the new
// claim completes.
func TestLeaseStaleWorkerFencedAfterDiscard(t *testing.T) {
	t.Parallel()
	for _, tc := range staleEndings() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := leaseSetup(t)
			ev := leaseEvent("evt_discarded")

			staleWork := tc.work(b)
			stale := b.startBlocked(t, ev, txhook.LeaseHandler{Lease: 200 * time.Millisecond, RenewEvery: -1, Work: staleWork}, false)
			if c := stale.claim(t); c.Token != 1 {
				t.Fatalf("stale worker's token = %d, want 1", c.Token)
			}

			// The takeover fails for good: a dead letter.
			var takeover txhook.Claim
			failing := txhook.LeaseHandler{Lease: time.Minute, Work: func(_ context.Context, c txhook.Claim, _ txhook.Event) (txhook.TxFunc, error) {
				takeover = c
				return nil, txhook.Permanent(errors.New("unknown account"))
			}}
			until(t, "a takeover", func() bool {
				res, err := b.p.ProcessLease(t.Context(), ev, failing)
				if err != nil {
					t.Fatalf("takeover delivery: %v", err)
				}
				switch res.Outcome {
				case txhook.OutcomeInFlight:
					return false
				case txhook.OutcomeFailed:
					return true
				}
				t.Fatalf("takeover delivery: outcome %v, want failed", res.Outcome)
				return false
			})
			if takeover.Token != 2 {
				t.Fatalf("takeover's token = %d, want 2", takeover.Token)
			}

			// The operator discards the dead letter, as the console does.
			n, err := db.New(b.pool).AdminDiscardFailed(t.Context(), db.AdminDiscardFailedParams{Source: ev.Source, EventKey: ev.Key})
			if err != nil || n != 1 {
				t.Fatalf("discard = %d, %v; want 1 row", n, err)
			}

			// A new delivery claims the key afresh and stays in phase one.
			owner := b.startBlocked(t, ev, txhook.LeaseHandler{Lease: time.Minute, Work: b.chargeAndRecord("owner")}, false)
			if c := owner.claim(t); c.Token != 1 {
				t.Fatalf("new owner's token = %d, want 1 (a new row)", c.Token)
			}
			claimed := b.row(t, ev.Key)

			stale.finish(t)
			tc.wantLost(t, stale)
			if got := b.effects(t, ev.Key); len(got) != 0 {
				t.Errorf("effects = %v after the stale worker's phase two, want none", got)
			}
			wantSameClaim(t, b.row(t, ev.Key), claimed)

			owner.finish(t)
			if owner.err != nil || owner.res.Outcome != txhook.OutcomeProcessed {
				t.Fatalf("new owner = %v, %v; want processed", owner.res, owner.err)
			}
			if got := b.effects(t, ev.Key); len(got) != 1 || got[0] != "owner" {
				t.Errorf("effects = %v, want the new owner's only", got)
			}
			if r := b.row(t, ev.Key); r.Status != "done" || r.Attempts != 1 || r.LastError.Valid {
				t.Errorf("row = %+v, want done by the new row's attempt 1 with no error", r)
			}
		})
	}
}

// TestLeaseRenewalFencedAfterRowReplaced: a worker whose row was deleted and
// claimed anew under the same token (1) finds its claim gone at its next
// renewal, and does not extend the new claim's lease.
func TestLeaseRenewalFencedAfterRowReplaced(t *testing.T) {
	t.Parallel()
	b := leaseSetup(t)
	ev := leaseEvent("evt_renew_replaced")
	// The first renewal comes after the row is replaced below (a renewal in
	// between would find no row and say nothing of the fencing).
	old := b.startBlocked(t, ev, txhook.LeaseHandler{Lease: 10 * time.Second, RenewEvery: time.Second, Work: b.chargeAndRecord("old")}, true)
	old.claim(t)
	if _, err := b.pool.Exec(t.Context(), "DELETE FROM txhook_processed_events WHERE source = 'test' AND event_key = $1", ev.Key); err != nil {
		t.Fatal(err)
	}
	// The new claim does not renew, so its lease stays where the claim put it.
	owner := b.startBlocked(t, ev, txhook.LeaseHandler{Lease: time.Minute, RenewEvery: -1, Work: b.chargeAndRecord("owner")}, false)
	if c := owner.claim(t); c.Token != 1 {
		t.Fatalf("new owner's token = %d, want 1", c.Token)
	}
	claimed := b.row(t, ev.Key)

	select {
	case <-old.done:
	case <-time.After(renewalNotice):
		t.Fatalf("old worker's context did not end within %v of its row being replaced: its renewal (every 1s) did not notice (the lease's end, at 10s, would stop it)", renewalNotice)
	}
	if !errors.Is(old.cause, txhook.ErrLeaseLost) || !errors.Is(old.err, txhook.ErrLeaseLost) {
		t.Errorf("old worker = %v, %v, context cause %v; want ErrLeaseLost", old.res, old.err, old.cause)
	}
	wantSameClaim(t, b.row(t, ev.Key), claimed)

	owner.finish(t)
	if owner.err != nil || owner.res.Outcome != txhook.OutcomeProcessed {
		t.Fatalf("new owner = %v, %v; want processed", owner.res, owner.err)
	}
	if got := b.effects(t, ev.Key); len(got) != 1 || got[0] != "owner" {
		t.Errorf("effects = %v, want the new owner's only", got)
	}
}

// staleEnding is how a stale worker's claim may end: every write it makes
// then must miss a newer claim.
type staleEnding struct {
	name string
	// fail, when set, is the error of the stale worker's phase one (after
	// its external call); otherwise phase one returns commit's phase two.
	fail   error
	commit func(key string) txhook.TxFunc
}

// work returns the stale worker's phase one: an external call made even
// though its context has ended (a call already on the wire, a long pause),
// then the ending.
func (e staleEnding) work(b *leaseBundle) txhook.LeaseFunc {
	return func(ctx context.Context, c txhook.Claim, ev txhook.Event) (txhook.TxFunc, error) {
		if err := b.api.charge(context.WithoutCancel(ctx), c.IdempotencyKey("charge")); err != nil {
			return nil, err
		}
		if e.fail != nil {
			return nil, e.fail
		}
		return e.commit(ev.Key), nil
	}
}

// wantLost fails t unless the stale worker was told its claim was lost (and
// given its own error back, when its phase one failed).
func (e staleEnding) wantLost(t *testing.T, stale *blocked) {
	t.Helper()
	if !errors.Is(stale.err, txhook.ErrLeaseLost) || (e.fail != nil && !errors.Is(stale.err, e.fail)) {
		t.Errorf("stale worker = %v, %v; want an error matching ErrLeaseLost (and its own error)", stale.res, stale.err)
	}
}

// staleEndings are the endings of the fencing tests: phase one failing
// (the release) or failing for good (the failure record); and phase two:
// the done mark alone, business writes, and business writes followed by an
// error (the release) or a permanent one (the failure record).
func staleEndings() []staleEnding {
	errCommit := errors.New("ledger rejected the entry")
	errWork := errors.New("upstream timeout")
	fails := func(cause error) func(key string) txhook.TxFunc {
		return func(key string) txhook.TxFunc {
			return func(ctx context.Context, tx pgx.Tx) error {
				if err := recordEffect(key, "stale")(ctx, tx); err != nil {
					return err
				}
				return cause
			}
		}
	}
	return []staleEnding{
		{name: "phase one error", fail: errWork},
		{name: "phase one permanent error", fail: txhook.Permanent(errWork)},
		{name: "done mark only", commit: func(string) txhook.TxFunc { return nil }},
		{name: "business writes", commit: func(key string) txhook.TxFunc { return recordEffect(key, "stale") }},
		{name: "business writes then error", commit: fails(errCommit)},
		{name: "business writes then permanent error", commit: fails(txhook.Permanent(errCommit))},
	}
}
