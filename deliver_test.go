package txhook_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
)

// deliver calls p.Deliver under the tests' wait bound.
func deliver(t *testing.T, p *txhook.Processor, ev txhook.Event, o *txhook.DeliverOptions) (txhook.Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitBound)
	defer cancel()
	return p.Deliver(ctx, ev, o)
}

func TestDeliverFindsTheRouteOfSourceAndType(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ran := map[string]int{}
	note := func(name string) txhook.HandlerFunc {
		return func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
			ran[name]++
			return insertEffect(ctx, tx, ev)
		}
	}
	rs := txhook.NewRoutes()
	rs.Transactional("a", "same.type", note("a/same.type"))
	rs.Transactional("b", "same.type", note("b/same.type"))
	rs.Transactional("b", "", note("b/fallback"))
	p := b.processor(t, &txhook.Config{Routes: rs})

	for _, c := range []struct {
		source, typ, key string
		want             txhook.Outcome
	}{
		{"a", "same.type", "k1", txhook.OutcomeProcessed},
		{"b", "same.type", "k2", txhook.OutcomeProcessed},
		{"b", "other.type", "k3", txhook.OutcomeProcessed}, // b's fallback
		{"a", "other.type", "k4", txhook.OutcomeIgnored},   // a has no fallback
		{"c", "same.type", "k5", txhook.OutcomeIgnored},
	} {
		res, err := deliver(t, p, txhook.Event{Source: c.source, Key: c.key, Type: c.typ}, nil)
		if err != nil || res.Outcome != c.want {
			t.Errorf("deliver %s/%s: %v, %v; want %v", c.source, c.typ, res.Outcome, err, c.want)
		}
	}
	want := map[string]int{"a/same.type": 1, "b/same.type": 1, "b/fallback": 1}
	for name, n := range want {
		if ran[name] != n {
			t.Errorf("%s ran %d times, want %d (all runs: %v)", name, ran[name], n, ran)
		}
	}
	if n := b.keys(t); n != 3 {
		t.Errorf("%d keys recorded, want 3: an ignored event writes nothing", n)
	}
	if !p.HasRoutes("a") || !p.HasRoutes("b") || p.HasRoutes("c") {
		t.Errorf("HasRoutes(a, b, c) = %v, %v, %v; want true, true, false", p.HasRoutes("a"), p.HasRoutes("b"), p.HasRoutes("c"))
	}
}

func TestDeliverIgnoredEventIsValidated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.processor(t, &txhook.Config{Routes: txhook.NewRoutes()})
	_, err := deliver(t, p, txhook.Event{Source: "s", Key: "bad\x00key", Type: "t"}, nil)
	if !errors.Is(err, txhook.ErrInvalidEvent) {
		t.Fatalf("deliver of an invalid key without a route: %v, want ErrInvalidEvent", err)
	}
}

// A guarded delivery without a route records its key and body hash, so that
// the body cannot be replayed later under a routed type.
func TestDeliverGuardRecordsIgnoredEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rs := txhook.NewRoutes()
	rs.Transactional("s", "routed", insertEffect)
	p := b.processor(t, &txhook.Config{Routes: rs})
	g := &txhook.DeliverOptions{BodyDedupe: &txhook.BodyDedupe{}}
	hash := []byte("0123456789abcdef0123456789abcdef")

	res, err := deliver(t, p, txhook.Event{Source: "s", Key: "k1", Type: "unrouted", PayloadHash: hash}, g)
	if err != nil || res.Outcome != txhook.OutcomeIgnored {
		t.Fatalf("first delivery: %v, %v; want ignored", res.Outcome, err)
	}
	_, err = deliver(t, p, txhook.Event{Source: "s", Key: "k2", Type: "routed", PayloadHash: hash}, g)
	if re, ok := errors.AsType[*txhook.DuplicateBodyError](err); !ok || re.Key != "k1" {
		t.Fatalf("the same body under a new key and a routed type: %v, want a DuplicateBodyError naming k1", err)
	}
	if n := b.effects(t, "k2"); n != 0 {
		t.Errorf("replayed body applied %d times", n)
	}
}

// On the sender's last attempt a handler's error records the event as
// failed (a dead letter) instead of being returned for a retry that never
// comes; before it, the error is returned and nothing is recorded.
func TestDeliverLastAttemptRecordsFailed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fail := errors.New("downstream refused")
	rs := txhook.NewRoutes()
	rs.Transactional("s", "tx", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		if err := insertEffect(ctx, tx, ev); err != nil {
			return err
		}
		return fail
	})
	rs.Lease("s", "lease", txhook.LeaseHandler{Work: func(context.Context, txhook.Claim, txhook.Event) (txhook.TxFunc, error) {
		return nil, fail
	}})
	p := b.processor(t, &txhook.Config{Routes: rs, StorePayload: true})

	for _, typ := range []string{"tx", "lease"} {
		t.Run(typ, func(t *testing.T) {
			ev := txhook.Event{Source: "s", Key: "evt_" + typ, Type: typ, Payload: []byte(`{"n":1}`)}
			if _, err := deliver(t, p, ev, nil); !errors.Is(err, fail) {
				t.Fatalf("an attempt before the last: %v, want the handler's error", err)
			}
			rec, err := txhook.GetEventRecord(t.Context(), b.pool, "s", ev.Key)
			if typ == "tx" && !errors.Is(err, txhook.ErrEventNotFound) {
				t.Fatalf("after a failed try the key is recorded (%+v, %v); want no row", rec, err)
			}
			if typ == "lease" && (err != nil || rec.Status != txhook.StatusInProgress) {
				t.Fatalf("after a failed try: %+v, %v; want the released claim in progress", rec, err)
			}

			res, err := deliver(t, p, ev, &txhook.DeliverOptions{LastAttempt: true})
			if err != nil || res.Outcome != txhook.OutcomeFailed || !errors.Is(res.Err, fail) {
				t.Fatalf("last attempt: %v, %v (%v); want failed with the handler's error", res.Outcome, err, res.Err)
			}
			rec, err = txhook.GetEventRecord(t.Context(), b.pool, "s", ev.Key)
			if err != nil || rec.Status != txhook.StatusFailed || !strings.Contains(rec.LastError, fail.Error()) || string(rec.Payload) != `{"n":1}` {
				t.Fatalf("after the last attempt: %+v, %v; want failed with the error and the payload", rec, err)
			}
			if n := b.effects(t, ev.Key); n != 0 {
				t.Errorf("effects = %d, want 0: the failed attempt rolled back", n)
			}
			res, err = deliver(t, p, ev, nil)
			if err != nil || res.Outcome != txhook.OutcomeDuplicate {
				t.Errorf("a delivery of the dead letter: %v, %v; want duplicate", res.Outcome, err)
			}
		})
	}
}

func TestDeliverInboxRouteWithoutQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rs := txhook.NewRoutes()
	rs.Inbox("s", "t", insertEffect)
	p := b.processor(t, &txhook.Config{Routes: rs})
	res, err := deliver(t, p, txhook.Event{Source: "s", Key: "k", Type: "t"}, nil)
	if err == nil || !strings.Contains(err.Error(), "no queue") {
		t.Fatalf("inbox route without a queue: %v, %v; want an error naming the missing queue", res.Outcome, err)
	}
	if n := b.keys(t); n != 0 {
		t.Errorf("%d keys recorded, want none", n)
	}
	if err := p.UseQueue(nil); err == nil {
		t.Error("UseQueue(nil) succeeded")
	}
}

func TestRoutesRefuseMistakes(t *testing.T) {
	t.Parallel()
	h := func(context.Context, pgx.Tx, txhook.Event) error { return nil }
	for name, register := range map[string]func(rs *txhook.Routes){
		"twice": func(rs *txhook.Routes) {
			rs.Transactional("s", "t", h)
			rs.Lease("s", "t", txhook.LeaseHandler{Work: work})
		},
		"nil handler":  func(rs *txhook.Routes) { rs.Transactional("s", "t", nil) },
		"nil work":     func(rs *txhook.Routes) { rs.InboxLease("s", "t", txhook.LeaseHandler{}) },
		"empty source": func(rs *txhook.Routes) { rs.Inbox("", "t", h) },
		"NUL type":     func(rs *txhook.Routes) { rs.Transactional("s", "t\x00", h) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if v := recover(); v == nil {
					t.Errorf("%s: registered without a panic", name)
				}
			}()
			register(txhook.NewRoutes())
		})
	}
}

func work(context.Context, txhook.Claim, txhook.Event) (txhook.TxFunc, error) { return nil, nil }

// On the last attempt, a handler's error that comes with the work's context
// cancelled (a consumer's shutdown) is not the handler's failure: nothing is
// recorded as failed, and the error is returned, for the message to be
// delivered again.
func TestDeliverLastAttemptCancelledIsNotAFailure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rs := txhook.NewRoutes()
	rs.Transactional("s", "tx", func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		<-ctx.Done()
		return fmt.Errorf("call the shipping service: %w", ctx.Err())
	})
	rs.Lease("s", "lease", txhook.LeaseHandler{Work: func(ctx context.Context, _ txhook.Claim, _ txhook.Event) (txhook.TxFunc, error) {
		<-ctx.Done()
		return nil, fmt.Errorf("call the shipping service: %w", ctx.Err())
	}})
	p := b.processor(t, &txhook.Config{Routes: rs})
	for _, typ := range []string{"tx", "lease"} {
		t.Run(typ, func(t *testing.T) {
			ev := txhook.Event{Source: "s", Key: "evt_cut_" + typ, Type: typ, Payload: []byte(`{}`)}
			ctx, cancel := context.WithCancel(t.Context())
			time.AfterFunc(100*time.Millisecond, cancel)
			res, err := p.Deliver(ctx, ev, &txhook.DeliverOptions{LastAttempt: true})
			if err == nil || res.Outcome == txhook.OutcomeFailed {
				t.Fatalf("last attempt cut short: %v, %v; want an error and nothing recorded failed", res.Outcome, err)
			}
			rec, err := txhook.GetEventRecord(t.Context(), b.pool, "s", ev.Key)
			if err == nil && rec.Status == txhook.StatusFailed {
				t.Fatalf("the cut-short attempt was recorded as a dead letter: %+v", rec)
			}
		})
	}
}
