package main

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txhook/txhook/internal/childproc"
	"github.com/txhook/txhook/internal/localaddr"
	"github.com/txhook/txhook/internal/natsserver"
	"github.com/txhook/txhook/internal/pgcluster"
	"github.com/txhook/txhook/txhooktest"
)

// natsConfig sizes a run of the stripe-orders example consuming the
// JetStream stream ORDERS while it keeps dying.
type natsConfig struct {
	// DatabaseURL is the database the example writes to. Required.
	DatabaseURL string
	// RestartDB, when set, restarts PostgreSQL in immediate mode once,
	// halfway through the applies.
	RestartDB func(ctx context.Context) error

	Events     int // events published, each with its id in Nats-Msg-Id
	Publishers int // concurrent publishers
	Kills      int // SIGKILLs of the example while it applies the stream
	// CrashRate is the share of restarts that arm one of CrashPoints.
	CrashRate   float64
	CrashPoints []txhooktest.CrashPoint
	// DupRate and ConcurrentDupRate are the shares of events the publisher
	// publishes again later, and several times at once, with the same id
	// (its retries): the stream drops the copies within Duplicates, txhook
	// the later ones.
	DupRate, ConcurrentDupRate float64
	// LateRetryRate is the share of events published once more after the
	// others and after the stream's duplicate window.
	LateRetryRate float64
	// Duplicates is the stream's duplicate window, short so that some
	// retries land after it, as a second message.
	Duplicates time.Duration
	// AckWait is the consumer's: how soon the server delivers again what a
	// killed process held.
	AckWait time.Duration
	Timeout time.Duration
	Seed    uint64
	Log     func(format string, args ...any)
}

func defaultNATSConfig() natsConfig {
	return natsConfig{Events: 5000, Publishers: 4, Kills: 24, CrashRate: 0.25,
		CrashPoints: []txhooktest.CrashPoint{txhooktest.CrashAfterInsert, txhooktest.CrashAfterHandler, txhooktest.CrashBeforeCommit, txhooktest.CrashAfterCommit},
		DupRate:     0.05, ConcurrentDupRate: 0.02, LateRetryRate: 0.02, Duplicates: time.Second, AckWait: 2 * time.Second, Timeout: 10 * time.Minute}
}

// natsResult is what a NATS run did and found.
type natsResult struct {
	Events         int
	Published      int   // messages published, copies included
	PublishRetries int64 // publishes retried after an error (the server was down)
	LateRetries    int   // events published again after the duplicate window
	StreamMessages uint64
	Kills          int
	CrashExits     int
	OtherExits     int
	Restarts       int
	NATSRestarts   int
	DBRestarts     int
	Unacked        int // messages the consumer had not acknowledged at the end
	DeadLettered   uint64
	Lost           int
	Duplicated     int
	Problems       []string
	Elapsed        time.Duration
}

func (r natsResult) ok() bool {
	return r.Lost == 0 && r.Duplicated == 0 && r.Unacked == 0 && r.DeadLettered == 0
}

func (r natsResult) summary() string {
	return fmt.Sprintf("chaos nats: events=%d published=%d publish_retries=%d late_retries=%d stream_messages=%d kills=%d crash_exits=%d restarts=%d nats_restarts=%d db_restarts=%d unacked=%d dead_lettered=%d lost=%d duplicated=%d elapsed=%s",
		r.Events, r.Published, r.PublishRetries, r.LateRetries, r.StreamMessages, r.Kills, r.CrashExits, r.Restarts, r.NATSRestarts, r.DBRestarts,
		r.Unacked, r.DeadLettered, r.Lost, r.Duplicated, r.Elapsed.Round(100*time.Millisecond))
}

// The example's JetStream names (examples/stripe-orders/nats.go): the
// contract its publishers rely on.
const (
	ordersStream     = "ORDERS"
	ordersDeadStream = "ORDERS_DEAD"
	ordersConsumer   = "stripe-orders"
)

// runNATSMain runs the NATS scenario with the sizes of cfg that apply, on a
// durable throwaway PostgreSQL when dbURL is empty (restarted once when
// restartDB), and prints its summary.
func runNATSMain(ctx context.Context, cfg config, dbURL string, restartDB bool) (bool, error) {
	ncfg := defaultNATSConfig()
	if isFlagSet("events") {
		ncfg.Events = cfg.Events
	}
	if isFlagSet("kills") {
		ncfg.Kills = cfg.Kills
	}
	ncfg.Timeout, ncfg.Seed, ncfg.Log = cfg.Timeout, cfg.Seed, cfg.Log
	if dbURL == "" {
		if cfg.Log != nil {
			cfg.Log("no DATABASE_URL: starting a durable throwaway PostgreSQL")
		}
		c, err := pgcluster.StartDurable(ctx)
		if err != nil {
			return false, fmt.Errorf("start a throwaway PostgreSQL (or set DATABASE_URL): %w", err)
		}
		defer c.Stop()
		dbURL = c.URL
		if restartDB {
			ncfg.RestartDB = c.Restart
		}
	}
	ncfg.DatabaseURL = dbURL
	res, err := runNATS(ctx, ncfg)
	if err != nil {
		return false, err
	}
	for _, p := range res.Problems {
		fmt.Fprintln(os.Stderr, "problem:", p)
	}
	fmt.Println(res.summary())
	return res.ok(), nil
}

// runNATS starts a NATS server of its own and the stripe-orders example
// consuming its stream ORDERS, publishes cfg.Events Stripe events (some
// again, with the same id) while the example is SIGKILLed and restarted
// (sometimes with a crash point armed), the NATS server restarted once and
// PostgreSQL once, waits until the consumer has acknowledged every message,
// and checks the database against what was published.
func runNATS(ctx context.Context, cfg natsConfig) (natsResult, error) {
	start, logf := time.Now(), orDiscard(cfg.Log)
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	bin, remove, err := buildReceiver(ctx, logf, stripeOrdersPkg)
	if err != nil {
		return natsResult{}, err
	}
	defer remove()
	srv, err := natsserver.Start(ctx, "")
	if err != nil {
		return natsResult{}, fmt.Errorf("start nats-server: %w", err)
	}
	defer srv.Stop()
	nc, err := nats.Connect(srv.URL, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		return natsResult{}, fmt.Errorf("connect to NATS: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return natsResult{}, err
	}
	// The stream and consumer the example would create, made first with a
	// short duplicate window and ack wait, so that the run is short.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: ordersStream, Subjects: []string{"orders.>"}, Duplicates: cfg.Duplicates}); err != nil {
		return natsResult{}, fmt.Errorf("create stream: %w", err)
	}
	cons, err := js.CreateConsumer(ctx, ordersStream, jetstream.ConsumerConfig{Durable: ordersConsumer,
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: cfg.AckWait, MaxDeliver: 10})
	if err != nil {
		return natsResult{}, fmt.Errorf("create consumer: %w", err)
	}

	tag := randomTag()
	rng := mrand.New(mrand.NewPCG(cfg.Seed, 0x6e617473))
	p := makePlan(config{Events: cfg.Events, Customers: 50, DupRate: cfg.DupRate, ConcurrentDupRate: cfg.ConcurrentDupRate,
		GuestRate: 0.05, InvoiceRate: 0.10}, tag, rng)
	res := natsResult{Events: len(p.events)}

	addr, err := localaddr.Free()
	if err != nil {
		return res, err
	}
	env := []string{"DATABASE_URL=" + cfg.DatabaseURL, "STRIPE_WEBHOOK_SECRET=whsec_chaos_" + tag, "NATS_URL=" + srv.URL}
	l := &launcher{bin: bin, addr: addr, env: env, log: &childproc.Output{Max: 256 << 10}}
	sup := &supervisor{l: l, rng: mrand.New(mrand.NewPCG(cfg.Seed, 0x73757076)),
		cfg:     config{CrashRate: cfg.CrashRate, CrashPoints: cfg.CrashPoints},
		killReq: make(chan chan struct{}), up: make(chan struct{})}
	supCtx, stopSup := context.WithCancel(ctx)
	defer stopSup()
	supDone := make(chan error, 1)
	go func() { supDone <- sup.loop(supCtx, logf) }()
	select {
	case <-sup.up:
	case err := <-supDone:
		return res, fmt.Errorf("start example: %w", err)
	}
	logf("stripe-orders consuming %s on %s; publishing %d events (%d copies), %d kills", ordersStream, srv.URL, len(p.events), p.duplicates, cfg.Kills)

	// Publishers: each job's copies at once, every publish retried until
	// the stream stored it.
	var published atomic.Int32
	var retries atomic.Int64
	pubCtx, stopPub := context.WithCancel(ctx)
	defer stopPub()
	publish := func(pubCtx context.Context, e *event) {
		for pubCtx.Err() == nil {
			pctx, cancel := context.WithTimeout(pubCtx, 2*time.Second)
			_, err := js.PublishMsg(pctx, &nats.Msg{Subject: "orders." + e.kind, Data: e.body,
				Header: nats.Header{jetstream.MsgIDHeader: {e.id}}})
			cancel()
			if err == nil {
				e.acked.Store(true) // stored in the stream: the consumer owes it
				published.Add(1)
				return
			}
			retries.Add(1)
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitPublished := p.send(pubCtx, cfg.Publishers, publish)

	conn, err := pgx.Connect(ctx, cfg.DatabaseURL)
	if err != nil {
		return res, fmt.Errorf("connect to watch the database: %w", err)
	}
	defer func() { conn.Close(context.WithoutCancel(ctx)) }()
	appliedCount := func() int64 { // events settled so far; -1 while the database is away
		var n int64
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM txhook_processed_events WHERE source = 'stripe' AND starts_with(event_key, $1)`,
			"evt_"+tag+"_").Scan(&n); err != nil {
			if conn.IsClosed() {
				if c, err := pgx.Connect(ctx, cfg.DatabaseURL); err == nil {
					conn.Close(ctx)
					conn = c
				}
			}
			return -1
		}
		return n
	}

	// Kills, the NATS restart and the PostgreSQL restart at random points
	// of the applies' progress, so that they land while messages are in
	// flight however fast the machine is.
	n := int64(len(p.events))
	marks := make([]int64, cfg.Kills)
	for i := range marks {
		marks[i] = n/50 + rng.Int64N(max(1, n*8/10))
	}
	slices.Sort(marks)
	natsMark, dbMark := n/3, n/2
	for i, m := range marks {
		for {
			got := appliedCount()
			if got >= m || ctx.Err() != nil {
				break
			}
			if res.NATSRestarts == 0 && got >= natsMark {
				logf("restarting nats-server at %d/%d events applied", got, n)
				if err := srv.Restart(ctx); err != nil {
					return res, fmt.Errorf("restart nats-server: %w", err)
				}
				res.NATSRestarts++
			}
			if cfg.RestartDB != nil && res.DBRestarts == 0 && got >= dbMark {
				logf("restarting PostgreSQL (immediate mode) at %d/%d events applied", got, n)
				if err := cfg.RestartDB(ctx); err != nil {
					return res, fmt.Errorf("restart PostgreSQL: %w", err)
				}
				res.DBRestarts++
			}
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(time.Duration(rng.Int64N(int64(50 * time.Millisecond))))
		if !sup.kill(ctx) {
			break
		}
		if (i+1)%10 == 0 {
			logf("%d kills", i+1)
		}
	}
	waitPublished()
	// Retries after the stream's duplicate window: second messages of the
	// same events, for txhook to answer as duplicates.
	time.Sleep(cfg.Duplicates + 100*time.Millisecond)
	for _, e := range p.events {
		if rng.Float64() < cfg.LateRetryRate {
			publish(pubCtx, e)
			res.LateRetries++
		}
	}
	res.Published, res.PublishRetries = int(published.Load()), retries.Load()
	if res.NATSRestarts == 0 { // the applies outran the marks: restart now
		logf("restarting nats-server after the publishes")
		if err := srv.Restart(ctx); err != nil {
			return res, fmt.Errorf("restart nats-server: %w", err)
		}
		res.NATSRestarts++
	}
	if cfg.RestartDB != nil && res.DBRestarts == 0 { // likewise
		logf("restarting PostgreSQL (immediate mode) after the publishes")
		if err := cfg.RestartDB(ctx); err != nil {
			return res, fmt.Errorf("restart PostgreSQL: %w", err)
		}
		res.DBRestarts++
	}

	// The consumer drains the stream: every message acknowledged.
	for sup.restarting.Load() && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	logf("published %d messages (%d retries); waiting for the consumer to acknowledge them all", res.Published, res.PublishRetries)
	for {
		info, err := cons.Info(ctx)
		if err == nil && info.NumAckPending == 0 && info.NumPending == 0 {
			break
		}
		if ctx.Err() != nil {
			if err == nil {
				res.Unacked = int(info.NumAckPending) + int(info.NumPending)
			}
			logf("timed out waiting for the consumer (%v)", err)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	stopSup()
	if err := <-supDone; err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return res, fmt.Errorf("supervise example: %w", err)
	}
	res.Kills, res.CrashExits, res.OtherExits, res.Restarts = sup.kills, sup.crashExits, sup.otherExits, sup.starts-1

	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer scancel()
	for name, dst := range map[string]*uint64{ordersStream: &res.StreamMessages, ordersDeadStream: &res.DeadLettered} {
		s, err := js.Stream(sctx, name)
		if err != nil {
			return res, fmt.Errorf("read stream %s: %w", name, err)
		}
		*dst = s.CachedInfo().State.Msgs
	}
	var vres result
	if err := verify(sctx, cfg.DatabaseURL, tag, p.events, nil, true, &vres); err != nil {
		return res, err
	}
	res.Lost, res.Duplicated, res.Problems = vres.Lost, vres.Duplicated, vres.Problems
	for _, e := range p.events {
		if !e.acked.Load() {
			res.Problems = append(res.Problems, fmt.Sprintf("%s was never stored in the stream", e.id))
			res.Lost++
		}
	}
	if res.OtherExits > 0 {
		res.Problems = append(res.Problems, fmt.Sprintf("the example exited on its own %d times; last log lines:\n%s", res.OtherExits, l.log.Tail(20)))
	}
	res.Elapsed = time.Since(start)
	return res, nil
}
