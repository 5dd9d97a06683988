package txhook_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/db"
	"github.com/txhook/txhook/internal/testdb"
)

// benchProcessor returns a processor configured by cfg (nil for the
// defaults; StorePayload always on) on a fresh database with an effects
// table, and the handler that writes to it.
func benchProcessor(b *testing.B, cfg *txhook.Config) (*txhook.Processor, txhook.HandlerFunc) {
	b.Helper()
	d := testdb.New(b)
	if _, err := d.Pool.Exec(b.Context(), `CREATE TABLE bench_effects (event_key text PRIMARY KEY, amount bigint NOT NULL);
		CREATE TABLE bench_totals (id int PRIMARY KEY, total bigint NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	c := txhook.Config{StorePayload: true}
	if cfg != nil {
		c = *cfg
		c.StorePayload = true
	}
	p, err := txhook.NewProcessor(d.Pool, &c)
	if err != nil {
		b.Fatal(err)
	}
	h := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		_, err := tx.Exec(ctx, "INSERT INTO bench_effects (event_key, amount) VALUES ($1, 500)", ev.Key)
		return err
	}
	return p, h
}

var benchPayload = []byte(`{"id":"evt_bench","object":"event","type":"checkout.session.completed","data":{"object":{"id":"cs_bench","amount_total":500}}}`)

// BenchmarkProcessNew measures a new event end to end against PostgreSQL:
// BEGIN with the dedupe step, one business write, COMMIT (three round
// trips).
func BenchmarkProcessNew(b *testing.B) {
	benchNew(b, nil)
}

// BenchmarkProcessNewFirstStatement is BenchmarkProcessNew with
// Config.DedupeWithFirstStatement: BEGIN, the dedupe step and the business
// write in one round trip, then COMMIT (two).
func BenchmarkProcessNewFirstStatement(b *testing.B) {
	benchNew(b, &txhook.Config{DedupeWithFirstStatement: true})
}

// BenchmarkProcessTwoWrites is a new event whose handler makes two writes,
// the example's shape (a row, then a running total's upsert), with
// Config.DedupeWithFirstStatement: BEGIN, the dedupe step and the first
// write in one round trip, then the second write, then COMMIT (three).
func BenchmarkProcessTwoWrites(b *testing.B) {
	benchNewWith(b, &txhook.Config{DedupeWithFirstStatement: true}, twoWrites(false))
}

// BenchmarkProcessTwoWritesDeferred is BenchmarkProcessTwoWrites with the
// second write deferred (txhook.Deferred): it travels with COMMIT (two
// round trips).
func BenchmarkProcessTwoWritesDeferred(b *testing.B) {
	benchNewWith(b, &txhook.Config{DedupeWithFirstStatement: true}, twoWrites(true))
}

// twoWrites returns a handler that inserts the event's row and adds to a
// running total, the second write deferred if deferSecond.
func twoWrites(deferSecond bool) txhook.HandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		if _, err := tx.Exec(ctx, "INSERT INTO bench_effects (event_key, amount) VALUES ($1, 500)", ev.Key); err != nil {
			return err
		}
		var q db.DBTX = tx
		if deferSecond {
			q = txhook.Deferred(tx)
		}
		_, err := q.Exec(ctx, `INSERT INTO bench_totals AS t (id, total) VALUES (1, 500)
			ON CONFLICT (id) DO UPDATE SET total = t.total + EXCLUDED.total`)
		return err
	}
}

func benchNew(b *testing.B, cfg *txhook.Config) {
	benchNewWith(b, cfg, nil)
}

// benchNewWith measures new events processed with h (nil for
// benchProcessor's one write).
func benchNewWith(b *testing.B, cfg *txhook.Config, h txhook.HandlerFunc) {
	p, oneWrite := benchProcessor(b, cfg)
	if h == nil {
		h = oneWrite
	}
	ctx := b.Context()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		res, err := p.Process(ctx, txhook.Event{Source: "bench", Key: "evt_" + strconv.Itoa(i), Type: "checkout.session.completed", Payload: benchPayload}, h)
		if err != nil || res.Outcome != txhook.OutcomeProcessed {
			b.Fatalf("process = %v, %v", res.Outcome, err)
		}
	}
}

// BenchmarkProcessNewParallel is BenchmarkProcessNew from GOMAXPROCS
// goroutines sharing the pool.
func BenchmarkProcessNewParallel(b *testing.B) {
	p, h := benchProcessor(b, nil)
	ctx := b.Context()
	var n atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := "evt_" + strconv.FormatInt(n.Add(1), 10)
			res, err := p.Process(ctx, txhook.Event{Source: "bench", Key: key, Type: "checkout.session.completed", Payload: benchPayload}, h)
			if err != nil || res.Outcome != txhook.OutcomeProcessed {
				b.Errorf("process = %v, %v", res.Outcome, err)
				return
			}
		}
	})
}

// BenchmarkProcessDuplicate measures a redelivery of a processed event to
// the Processor that processed it: answered from its memory of settled keys
// (Config.RecentKeys), with no round trip.
func BenchmarkProcessDuplicate(b *testing.B) {
	benchDuplicate(b, nil)
}

// BenchmarkProcessDuplicateNoMemory measures the same redelivery without
// that memory, as another process sees it: after a dozen duplicates the
// Processor reads whether the key is settled, one round trip outside any
// transaction; the handler never runs.
func BenchmarkProcessDuplicateNoMemory(b *testing.B) {
	benchDuplicate(b, &txhook.Config{RecentKeys: -1})
}

func benchDuplicate(b *testing.B, cfg *txhook.Config) {
	p, h := benchProcessor(b, cfg)
	ctx := b.Context()
	ev := txhook.Event{Source: "bench", Key: "evt_dup", Type: "checkout.session.completed", Payload: benchPayload}
	if _, err := p.Process(ctx, ev, h); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		res, err := p.Process(ctx, ev, h)
		if err != nil || res.Outcome != txhook.OutcomeDuplicate {
			b.Fatalf("process = %v, %v", res.Outcome, err)
		}
	}
}

// BenchmarkProcessPermanentFailure measures the failure path: a handler
// that writes and then fails permanently, so that the event is recorded as
// failed, with its payload (as every failed event is, for its replay) and
// without one (an event with an empty payload), side by side: the
// difference is what keeping dead letters replayable costs.
func BenchmarkProcessPermanentFailure(b *testing.B) {
	payload := make([]byte, 2048) // a typical webhook body
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	for _, size := range []int{0, len(payload)} {
		b.Run("payload="+strconv.Itoa(size)+"B", func(b *testing.B) {
			d := testdb.New(b)
			p, err := txhook.NewProcessor(d.Pool, &txhook.Config{RecentKeys: -1})
			if err != nil {
				b.Fatal(err)
			}
			failing := func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
				return txhook.Permanent(errors.New("unknown account"))
			}
			var n int
			for b.Loop() {
				n++
				ev := txhook.Event{Source: "bench", Key: "evt_fail_" + strconv.Itoa(n), Type: "t", Payload: payload[:size]}
				res, err := p.Process(b.Context(), ev, failing)
				if err != nil || res.Outcome != txhook.OutcomeFailed {
					b.Fatalf("process: %v, %v", res.Outcome, err)
				}
			}
		})
	}
}
