package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/internal/natsserver"
	"github.com/txhook/txhook/natsconsumer"
)

// NATS JetStream rows of the report. A load generator in this process
// publishes checkout events (their ids in Nats-Msg-Id) to a stream of a
// nats-server of the run's own (file storage) and waits, for each, until
// the consumer has acknowledged it after its COMMIT: c publishers, so c
// messages in flight. The txhook row is natsconsumer with MaxInFlight c and
// the example's handler and processor settings; the hand-written row is the
// usual consumer: c workers reading one pull subscription (Messages), each
// message applied in one transaction (its id inserted ON CONFLICT DO
// NOTHING, then the writes: the baseline HTTP receiver's code) and acked
// after COMMIT. Both run in this process, on pools of c connections.
const (
	scenNATS     = "NATS consumer (txhook)"
	scenNATSHand = "NATS consumer (hand-written)"
)

// natsTarget is the txhook row's target against the hand-written one.
const natsTarget = 1.0

// natsBench holds what the NATS rows share at one concurrency.
type natsBench struct {
	srv      *natsserver.Server
	nc       *nats.Conn
	js       jetstream.JetStream
	pools    []*pgxpool.Pool
	consumer *natsconsumer.Consumer
	handIter jetstream.MessagesContext
	handDone sync.WaitGroup
	waiters
}

// Streams of the two rows: each consumer reads its own.
const (
	natsTxStream   = "BENCH_TXHOOK"
	natsHandStream = "BENCH_HAND"
)

// newNATSBench starts a nats-server, its streams and both consumers at
// concurrency c.
func newNATSBench(ctx context.Context, dbURL string, c int) (*natsBench, error) {
	b := &natsBench{}
	fail := func(err error) (*natsBench, error) {
		b.stop()
		return nil, err
	}
	var err error
	if b.srv, err = natsserver.Start(ctx, ""); err != nil {
		return nil, fmt.Errorf("start nats-server: %w", err)
	}
	if b.nc, err = nats.Connect(b.srv.URL); err != nil {
		return fail(fmt.Errorf("connect to NATS: %w", err))
	}
	if b.js, err = jetstream.New(b.nc); err != nil {
		return fail(err)
	}
	for _, s := range []string{natsTxStream, natsHandStream, natsTxStream + "_DEAD"} {
		subject := s + ".>"
		if s == natsTxStream+"_DEAD" {
			subject = s
		}
		if _, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: s, Subjects: []string{subject}, Storage: jetstream.FileStorage}); err != nil {
			return fail(fmt.Errorf("create stream %s: %w", s, err))
		}
	}
	var cons [2]jetstream.Consumer
	for i, s := range []string{natsTxStream, natsHandStream} {
		if cons[i], err = b.js.CreateConsumer(ctx, s, jetstream.ConsumerConfig{Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 4 * c}); err != nil {
			return fail(fmt.Errorf("create consumer on %s: %w", s, err))
		}
	}
	pool := func() (*pgxpool.Pool, error) {
		u, err := withPoolSize(dbURL, c)
		if err != nil {
			return nil, err
		}
		p, err := pgxpool.New(ctx, u)
		if err != nil {
			return nil, fmt.Errorf("open pool: %w", err)
		}
		b.pools = append(b.pools, p)
		return p, nil
	}

	txPool, err := pool()
	if err != nil {
		return fail(err)
	}
	rs := txhook.NewRoutes()
	rs.Transactional("stripe", "checkout.session.completed", libraryHandler)
	proc, err := txhook.NewProcessor(txPool, &txhook.Config{StorePayload: true, DedupeWithFirstStatement: true, Routes: rs})
	if err != nil {
		return fail(err)
	}
	b.consumer, err = natsconsumer.New(proc, b.js, &natsconsumer.Config{
		Stream: natsTxStream, Consumer: "bench", Source: "stripe", MaxInFlight: c,
		TypeSubjectPrefix: natsTxStream + ".", DeadLetterSubject: natsTxStream + "_DEAD",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Observer: handler.ObserverFunc(func(_ context.Context, r handler.Report) {
			if r.Answer == handler.AnswerProcessed || r.Answer == handler.AnswerDuplicate {
				b.signal(r.Key)
			}
		}),
	})
	if err != nil {
		return fail(err)
	}
	if err := b.consumer.Start(ctx); err != nil {
		return fail(err)
	}

	handPool, err := pool()
	if err != nil {
		return fail(err)
	}
	if b.handIter, err = cons[1].Messages(jetstream.PullMaxMessages(c)); err != nil {
		return fail(fmt.Errorf("hand-written consumer: %w", err))
	}
	for range c {
		b.handDone.Go(func() { b.handWorker(ctx, handPool) })
	}
	return b, nil
}

// handWorker is one worker of the hand-written consumer: it applies each
// message in one transaction and acks it after COMMIT, or naks it.
func (b *natsBench) handWorker(ctx context.Context, pool *pgxpool.Pool) {
	for {
		msg, err := b.handIter.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return
			}
			continue
		}
		var ev checkout
		if err := json.Unmarshal(msg.Data(), &ev); err != nil || ev.ID == "" {
			_ = msg.Term()
			continue
		}
		if err := baselineApply(ctx, pool, ev, msg.Data()); err != nil {
			_ = msg.NakWithDelay(time.Second)
			continue
		}
		_ = msg.Ack()
		b.signal(ev.ID)
	}
}

func (b *natsBench) stop() {
	if b.consumer != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := b.consumer.Stop(ctx); err != nil {
			logf("stop the NATS consumer: %v", err)
		}
		cancel()
	}
	if b.handIter != nil {
		b.handIter.Stop()
		b.handDone.Wait()
	}
	if b.nc != nil {
		b.nc.Close()
	}
	for _, p := range b.pools {
		p.Close()
	}
	if b.srv != nil {
		b.srv.Stop()
	}
}

// natsScenarios returns the NATS rows at concurrency c.
func natsScenarios(o options, c int, b *natsBench) []scenario {
	row := func(name, stream, prefix string) scenario {
		src := eventSource{prefix: o.tag + prefix + strconv.Itoa(c), customers: customers}
		next := make([]int, c)
		return scenario{name: name, measure: func(ctx context.Context) (sample, error) {
			return measure(ctx, c, o.warmup, o.duration, nil, func(ctx context.Context, w int) error {
				key, body := src.next(w, next[w])
				next[w]++
				ch := b.wait(key)
				_, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: stream + ".checkout.session.completed", Data: body,
					Header: nats.Header{jetstream.MsgIDHeader: {key}}})
				if err != nil {
					b.signal(key)
					return fmt.Errorf("publish: %w", err)
				}
				return await(ctx, ch)
			}), nil
		}}
	}
	return []scenario{row(scenNATS, natsTxStream, "natstx"), row(scenNATSHand, natsHandStream, "natshand")}
}

// natsRatios are the NATS rows' line in the ratios table.
var natsRatios = []ratioRow{
	{"NATS consumer: txhook / hand-written", scenNATS, scenNATSHand},
}

// describeNATS explains the NATS rows and reports their target.
func (r *report) describeNATS(p func(string, ...any)) {
	if _, ok := r.find(scenNATS, r.opts.conc[0]); !ok {
		return
	}
	p("")
	p("NATS JetStream rows (%s, %s): a load generator in this process publishes each checkout event, its id in", scenNATS, scenNATSHand)
	p("`Nats-Msg-Id`, to a stream of a nats-server of the run's own (file storage) and waits until the consumer has acked it")
	p("after its COMMIT: c publishers, so c messages in flight; the latency is from the publish to that ack. The txhook row")
	p("is `natsconsumer` (MaxInFlight c) with the example's handler and processor settings; the hand-written row is the")
	p("usual consumer, c workers on one pull subscription, each message in one transaction (its id inserted ON CONFLICT DO")
	p("NOTHING, then the writes) and acked after COMMIT. Both consumers run in this process, so CPU per event's client")
	p("column holds the publisher and the consumer; nats-server is in the rest.")
	for _, c := range r.opts.conc {
		got := r.ratio(scenNATS, scenNATSHand, c)
		verdict := "met"
		if got < natsTarget {
			verdict = "**missed**"
		}
		tx, _ := r.find(scenNATS, c)
		hand, _ := r.find(scenNATSHand, c)
		p("- c=%d: txhook / hand-written %.2f× (target ≥ %.1f×): %s; CPU ms per event %.2f vs %.2f.", c, got, natsTarget, verdict,
			tx.CPU.Client+tx.CPU.Receiver+tx.CPU.Rest, hand.CPU.Client+hand.CPU.Receiver+hand.CPU.Rest)
	}
}
