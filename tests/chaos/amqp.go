package main

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txhook/txhook/internal/childproc"
	"github.com/txhook/txhook/internal/localaddr"
	"github.com/txhook/txhook/internal/rabbitnode"
	"github.com/txhook/txhook/txhooktest"
)

// amqpConfig sizes a run of the stripe-orders example consuming the
// RabbitMQ queue orders (AMQP_URL) while it is killed, the broker
// restarted and PostgreSQL restarted.
type amqpConfig struct {
	// DatabaseURL is the database the example writes to. Required.
	DatabaseURL string
	// RestartDB, when set, restarts PostgreSQL in immediate mode once,
	// halfway through the messages.
	RestartDB func(ctx context.Context) error
	// Node is the broker and VHost the virtual host of the run's queues;
	// nil Node: the run starts a node of its own (and restarts it).
	Node  *rabbitnode.Node
	VHost string
	// RestartBroker, when set, restarts the broker (or, on a broker shared
	// with others, closes the run's connections) once, a third of the way
	// through; with Node nil the run restarts its own node.
	RestartBroker func(ctx context.Context) error

	Messages int // events, each published once with its id
	// RetryRate is the share of events a publisher publishes again with
	// the same id, a little later.
	RetryRate float64
	Kills     int // SIGKILLs of the example while messages are applied
	Customers int
	CrashRate float64 // share of restarts with a crash point armed
	Timeout   time.Duration
	Seed      uint64
	Log       func(format string, args ...any)
}

func defaultAMQPConfig() amqpConfig {
	return amqpConfig{Messages: 5000, RetryRate: 0.10, Kills: 24, Customers: 50, CrashRate: 0.25, Timeout: 10 * time.Minute}
}

// amqpResult is what an AMQP run did and found.
type amqpResult struct {
	Messages       int
	Publishes      int64 // publishes confirmed, publisher retries included
	Retries        int   // events planned to be published twice
	Kills          int
	CrashExits     int
	OtherExits     int
	Restarts       int
	BrokerRestarts int
	DBRestarts     int
	Unacked        int // messages left in the queue and its retry queues
	DeadLettered   int // messages in the dead-letter queue
	Lost           int
	Duplicated     int
	BrokerRestart  time.Duration // how long the broker's restart took
	Problems       []string
	Elapsed        time.Duration
}

func (r amqpResult) ok() bool {
	return r.Lost == 0 && r.Duplicated == 0 && r.Unacked == 0 && r.DeadLettered == 0
}

func (r amqpResult) summary() string {
	return fmt.Sprintf("chaos amqp: messages=%d publishes=%d publisher_retries=%d kills=%d crash_exits=%d restarts=%d broker_restarts=%d (%s) db_restarts=%d unacked=%d dead_lettered=%d lost=%d duplicated=%d elapsed=%s",
		r.Messages, r.Publishes, r.Retries, r.Kills, r.CrashExits, r.Restarts, r.BrokerRestarts, r.BrokerRestart.Round(100*time.Millisecond),
		r.DBRestarts, r.Unacked, r.DeadLettered, r.Lost, r.Duplicated, r.Elapsed.Round(100*time.Millisecond))
}

// runAMQPMain runs the AMQP scenario with the sizes of cfg that apply
// (-events, -kills), on a RabbitMQ node of its own; see onDatabase.
func runAMQPMain(ctx context.Context, cfg config, dbURL string, restartDB bool) (bool, error) {
	acfg := defaultAMQPConfig()
	if isFlagSet("events") {
		acfg.Messages = cfg.Events
	}
	if isFlagSet("kills") {
		acfg.Kills = cfg.Kills
	}
	acfg.Timeout, acfg.Seed, acfg.Log = cfg.Timeout, cfg.Seed, cfg.Log
	return onDatabase(ctx, cfg.Log, dbURL, restartDB, func(url string, restart func(context.Context) error) (outcome, []string, error) {
		acfg.DatabaseURL, acfg.RestartDB = url, restart
		res, err := runAMQP(ctx, acfg)
		return res, res.Problems, err
	})
}

// ordersQueue is the example's queue (its contract with publishers).
const ordersQueue = "orders"

// runAMQP builds the example and runs it with AMQP_URL; a publisher
// publishes every event once, with confirms, and some a second time; the
// example is SIGKILLed and restarted (sometimes with a crash point armed),
// the broker restarted once and PostgreSQL once. At the end every event
// must be applied exactly once, and no message left in the queues.
func runAMQP(ctx context.Context, cfg amqpConfig) (amqpResult, error) {
	start := time.Now()
	logf := cfg.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	res := amqpResult{}
	if cfg.Node == nil {
		logf("starting a RabbitMQ node of the run's own")
		t0 := time.Now()
		n, err := rabbitnode.Start(ctx)
		if err != nil {
			return res, fmt.Errorf("start RabbitMQ: %w", err)
		}
		defer n.Stop()
		logf("RabbitMQ node %s up in %s", n.Name, time.Since(t0).Round(100*time.Millisecond))
		cfg.Node, cfg.VHost, cfg.RestartBroker = n, "/", n.Restart
	}
	brokerURL := strings.TrimSuffix(cfg.Node.URL, "/") + "/" + strings.TrimPrefix(cfg.VHost, "/")
	if cfg.VHost == "/" {
		brokerURL = cfg.Node.URL
	}

	dir, err := os.MkdirTemp("", "txhook-chaos-amqp-")
	if err != nil {
		return res, fmt.Errorf("create temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	logf("building %s", stripeOrdersPkg)
	bins, err := childproc.Build(ctx, dir, stripeOrdersPkg)
	if err != nil {
		return res, err
	}

	tag := randomTag()
	rng := mrand.New(mrand.NewPCG(cfg.Seed, 0x616d7170))
	p := makePlan(config{
		Events: cfg.Messages, Customers: cfg.Customers, GuestRate: 0.05, InvoiceRate: 0.10, DupRate: cfg.RetryRate,
	}, tag, rng)
	res.Messages, res.Retries = len(p.events), p.duplicates

	addr, err := localaddr.Free()
	if err != nil {
		return res, err
	}
	env := []string{"DATABASE_URL=" + cfg.DatabaseURL, "STRIPE_WEBHOOK_SECRET=whsec_chaos_amqp_" + tag, "AMQP_URL=" + brokerURL}
	l := &launcher{bin: bins[stripeOrdersPkg], addr: addr, env: env, log: &childproc.Output{Max: 256 << 10}}
	sup := &supervisor{l: l, rng: mrand.New(mrand.NewPCG(cfg.Seed, 0x73757076)),
		cfg:     config{CrashRate: cfg.CrashRate, CrashPoints: []txhooktest.CrashPoint{txhooktest.CrashAfterInsert, txhooktest.CrashAfterHandler, txhooktest.CrashBeforeCommit, txhooktest.CrashAfterCommit}},
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
	logf("stripe-orders consuming %s on %s; publishing %d events (%d publisher retries), %d kills",
		ordersQueue, brokerURL, len(p.events), p.duplicates, cfg.Kills)

	// A pool, not a connection: PostgreSQL's restart ends the connection
	// the watch is on, and the pool opens another.
	watch, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return res, fmt.Errorf("connect to watch the database: %w", err)
	}
	defer watch.Close()
	var applied atomic.Int64
	countApplied := func() {
		var n int64
		if err := watch.QueryRow(ctx, `SELECT count(*) FROM txhook_processed_events
			WHERE source = 'stripe' AND starts_with(event_key, $1) AND status = 'done'`, "evt_"+tag+"_").Scan(&n); err == nil {
			applied.Store(n)
		}
	}

	pub := &publisher{url: brokerURL, log: logf}
	defer pub.close()
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		for _, j := range p.jobs {
			if !pub.publish(ctx, j.ev) {
				return
			}
			j.ev.acked.Store(true) // confirmed: the broker's to deliver
		}
	}()

	// Kills at random points of the progress, the broker's restart at a
	// third, PostgreSQL's at a half.
	n := int64(len(p.events))
	marks := make([]int64, cfg.Kills)
	for i := range marks {
		marks[i] = n/50 + rng.Int64N(max(1, n*9/10))
	}
	slices.Sort(marks)
	brokerMark, dbMark := n/3, n/2
	var restartErr error // a failed restart fails the run: it would prove nothing
	chaos := func() {
		if cfg.RestartBroker != nil && res.BrokerRestarts == 0 && applied.Load() >= brokerMark {
			logf("restarting the broker at %d/%d applied", applied.Load(), n)
			t0 := time.Now()
			if err := cfg.RestartBroker(ctx); err != nil {
				restartErr = errors.Join(restartErr, fmt.Errorf("restart the broker: %w", err))
			}
			res.BrokerRestart = time.Since(t0)
			res.BrokerRestarts++
			logf("broker back in %s", res.BrokerRestart.Round(100*time.Millisecond))
		}
		if cfg.RestartDB != nil && res.DBRestarts == 0 && applied.Load() >= dbMark {
			logf("restarting PostgreSQL (immediate mode) at %d/%d applied", applied.Load(), n)
			if err := cfg.RestartDB(ctx); err != nil {
				restartErr = errors.Join(restartErr, fmt.Errorf("restart PostgreSQL: %w", err))
			}
			res.DBRestarts++
		}
	}
	for i, m := range marks {
		for applied.Load() < m && ctx.Err() == nil {
			chaos()
			time.Sleep(20 * time.Millisecond)
			countApplied()
		}
		time.Sleep(time.Duration(rng.Int64N(int64(20 * time.Millisecond))))
		if !sup.kill(ctx) {
			break
		}
		if (i+1)%10 == 0 {
			logf("%d kills, %d/%d applied", i+1, applied.Load(), n)
		}
	}
	for applied.Load() < n && ctx.Err() == nil {
		chaos()
		time.Sleep(50 * time.Millisecond)
		countApplied()
	}
	// The applies may have outrun the marks between two looks: the
	// restarts not made yet are made now (every mark is passed).
	chaos()
	<-pubDone
	res.Publishes = pub.confirmed.Load()
	if restartErr != nil {
		return res, restartErr
	}
	// Every kill is followed by its restart; then the queues must drain.
	for sup.restarting.Load() && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	var left map[string]int
	for ctx.Err() == nil {
		left, err = cfg.Node.Queues(ctx, cfg.VHost, ordersQueue) // orders, its retry queues and its dead-letter queue
		if err == nil && sum(left, false) == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	stopSup()
	if err := <-supDone; err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return res, fmt.Errorf("supervise example: %w", err)
	}
	res.Kills, res.CrashExits, res.OtherExits, res.Restarts = sup.kills, sup.crashExits, sup.otherExits, sup.starts-1
	// Stopped, the example's unacknowledged messages are back in the queues.
	qctx, qcancel := context.WithTimeout(context.Background(), time.Minute)
	defer qcancel()
	if left, err = cfg.Node.Queues(qctx, cfg.VHost, ordersQueue); err != nil {
		return res, fmt.Errorf("count the queues' messages: %w", err)
	}
	res.Unacked, res.DeadLettered = sum(left, false), sum(left, true)
	logf("done: %d/%d applied; queues: %v", applied.Load(), n, left)

	vctx, vcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer vcancel()
	var vres result
	if err := verify(vctx, cfg.DatabaseURL, tag, p.events, nil, true, &vres); err != nil {
		return res, err
	}
	for _, e := range p.events {
		if !e.acked.Load() {
			res.Lost++ // never confirmed: the publisher gave up
			vres.Problems = append(vres.Problems, e.id+": never confirmed by the broker")
		}
	}
	res.Lost += vres.Lost
	res.Duplicated = vres.Duplicated
	res.Problems = vres.Problems
	if res.OtherExits > 0 {
		res.Problems = append(res.Problems, fmt.Sprintf("the example exited on its own %d times; last log lines:\n%s", res.OtherExits, l.log.Tail(20)))
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

// sum adds the messages of the dead-letter queue (dead) or of the others.
func sum(qs map[string]int, dead bool) int {
	t := 0
	for q, m := range qs {
		if (q == ordersQueue+".dead") == dead {
			t += m
		}
	}
	return t
}

// publisher publishes events to the orders queue with publisher confirms,
// through a connection it dials again whenever it drops: a publish that is
// not confirmed is published again, with the same message-id.
type publisher struct {
	url       string
	log       func(string, ...any)
	mu        sync.Mutex
	conn      *amqp.Connection
	ch        *amqp.Channel
	confirmed atomic.Int64
}

// publish publishes e until the broker confirms it, and reports false if
// ctx ended first.
func (p *publisher) publish(ctx context.Context, e *event) bool {
	for ctx.Err() == nil {
		if err := p.try(ctx, e); err == nil {
			p.confirmed.Add(1)
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

func (p *publisher) try(ctx context.Context, e *event) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ch == nil || p.ch.IsClosed() {
		p.closeLocked()
		conn, err := amqp.Dial(p.url)
		if err != nil {
			return err
		}
		ch, err := conn.Channel()
		if err == nil {
			err = ch.Confirm(false)
		}
		if err != nil {
			conn.Close()
			return err
		}
		p.conn, p.ch = conn, ch
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	dc, err := p.ch.PublishWithDeferredConfirmWithContext(pctx, "", ordersQueue, false, false, amqp.Publishing{
		MessageId: e.id, Type: e.kind, ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: e.body,
	})
	if err != nil {
		p.closeLocked()
		return err
	}
	ok, err := dc.WaitContext(pctx)
	if err != nil || !ok {
		p.closeLocked()
		return fmt.Errorf("not confirmed: %v", err)
	}
	return nil
}

func (p *publisher) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closeLocked()
}

func (p *publisher) closeLocked() {
	if p.conn != nil {
		p.conn.Close()
	}
	p.conn, p.ch = nil, nil
}
