package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/txhook/txhook/txhooktest"

	"github.com/txhook/txhook/internal/childproc"
	"github.com/txhook/txhook/internal/localaddr"
)

// config sizes a chaos run.
type config struct {
	// DatabaseURL is the database the example writes to. Required.
	DatabaseURL string
	// RestartDB, when set, restarts PostgreSQL in immediate mode once,
	// halfway through the run. Only for a throwaway cluster the run owns.
	RestartDB func(ctx context.Context) error

	Events    int // events to send
	Senders   int // concurrent senders
	Kills     int // SIGKILLs of the example during the run, over all receivers
	Customers int // customers the checkouts are spread over (hot rows)
	// Receivers is how many processes of the example run on the database,
	// each on its own port; the provider sends every delivery attempt to
	// the next one in turn, and each kill hits one drawn at random. 0 means
	// one.
	Receivers int

	DupRate           float64 // share of events redelivered a little later
	ConcurrentDupRate float64 // share of events delivered 2-3 times at once
	GuestRate         float64 // share of checkouts without a customer
	InvoiceRate       float64 // share of events that start an invoice (created + paid)
	LeaseRate         float64 // share of payment_intent.succeeded events (lease mode)
	// CrashRate is the share of restarts that arm a TXHOOK_CRASH_POINT.
	CrashRate float64
	// CrashPoints are the points armed on those restarts.
	CrashPoints []txhooktest.CrashPoint
	// CrashLimit bounds the restarts with a crash point armed, per
	// receiver; 0 means no bound.
	CrashLimit int
	// Fulfillment turns lease mode on: a local fulfillment service and
	// FULFILLMENT_URL pointing at it.
	Fulfillment bool
	// Naive drives the naive dedupe receiver (key committed alone, then the
	// work) instead of the example: checkouts only, and the check expects
	// to find losses. It shows that the check catches a receiver that loses
	// events.
	Naive bool
	// FulfillmentFailRate is the share of fulfillment calls answered 503.
	FulfillmentFailRate float64

	// Timeout bounds the whole run; events not acknowledged by then count
	// as lost.
	Timeout time.Duration
	// Seed makes the plan and the kill moments reproducible.
	Seed uint64
	// Log receives progress lines; nil for none.
	Log func(format string, args ...any)
}

// allCrashPoints are txhook's crash points in both modes.
var allCrashPoints = []txhooktest.CrashPoint{
	txhooktest.CrashAfterInsert, txhooktest.CrashAfterHandler, txhooktest.CrashBeforeCommit, txhooktest.CrashAfterCommit,
	txhooktest.CrashLeaseAfterClaim, txhooktest.CrashLeaseAfterExternal, txhooktest.CrashLeaseBeforeCommit, txhooktest.CrashLeaseAfterCommit,
}

// result is what a run did and found.
type result struct {
	Events             int
	Receivers          int
	Deliveries         int64 // HTTP requests sent, retries included
	DuplicatesInjected int   // deliveries planned beyond the first of each event
	Kills              int   // SIGKILLs sent
	KillsPerReceiver   []int // SIGKILLs sent to each receiver
	CrashExits         int   // exits at an armed crash point
	OtherExits         int   // exits neither killed nor at a crash point
	Restarts           int   // starts of the example after the first
	DBRestarts         int   // immediate-mode restarts of PostgreSQL
	Unacked            int   // events no delivery of which was acknowledged
	Rejected           int64 // 4xx answers other than 409
	FulfillmentCalls   int
	FulfillmentRepeats int
	Lost               int
	Duplicated         int
	Problems           []string
	Elapsed            time.Duration
}

// ok reports whether the run found every event applied exactly once.
func (r result) ok() bool { return r.Lost == 0 && r.Duplicated == 0 && r.Unacked == 0 }

// summary is the run's one-line report.
func (r result) summary() string {
	perReceiver := make([]string, len(r.KillsPerReceiver))
	for i, k := range r.KillsPerReceiver {
		perReceiver[i] = strconv.Itoa(k)
	}
	return fmt.Sprintf("chaos: receivers=%d events=%d deliveries=%d duplicates_injected=%d kills=%d kills_per_receiver=%s crash_exits=%d restarts=%d db_restarts=%d fulfillment_calls=%d fulfillment_repeats=%d unacked=%d lost=%d duplicated=%d elapsed=%s",
		r.Receivers, r.Events, r.Deliveries, r.DuplicatesInjected, r.Kills, strings.Join(perReceiver, "/"), r.CrashExits, r.Restarts, r.DBRestarts,
		r.FulfillmentCalls, r.FulfillmentRepeats, r.Unacked, r.Lost, r.Duplicated, r.Elapsed.Round(100*time.Millisecond))
}

// run builds the example, starts cfg.Receivers processes of it on the
// database, sends the plan to them in turn while killing and restarting
// them, then checks the database against what was sent.
func run(ctx context.Context, cfg config) (result, error) {
	start, logf := time.Now(), orDiscard(cfg.Log)
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	pkg := stripeOrdersPkg
	if cfg.Naive {
		pkg = naiveReceiverPkg
		// It handles checkouts only, always with a customer, and has no
		// lease mode.
		cfg.LeaseRate, cfg.InvoiceRate, cfg.GuestRate, cfg.Fulfillment = 0, 0, 0, false
		cfg.CrashPoints = slices.DeleteFunc(slices.Clone(cfg.CrashPoints), func(p txhooktest.CrashPoint) bool {
			return p != txhooktest.CrashAfterInsert && p != txhooktest.CrashAfterHandler // the ones it honours
		})
	}
	bin, remove, err := buildReceiver(ctx, logf, pkg)
	if err != nil {
		return result{}, err
	}
	defer remove()

	tag := randomTag()
	secret := "whsec_chaos_" + tag
	rng := mrand.New(mrand.NewPCG(cfg.Seed, 0x63686173))
	p := makePlan(cfg, tag, rng)
	receivers := max(cfg.Receivers, 1)
	res := result{Events: len(p.events), Receivers: receivers, DuplicatesInjected: p.duplicates}

	env := []string{"DATABASE_URL=" + cfg.DatabaseURL, "STRIPE_WEBHOOK_SECRET=" + secret}
	var fs *fulfillmentService
	if cfg.Fulfillment {
		fs = newFulfillmentService(cfg.Seed, cfg.FulfillmentFailRate)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return res, fmt.Errorf("listen for the fulfillment service: %w", err)
		}
		srv := &http.Server{Handler: fs, ReadHeaderTimeout: 5 * time.Second}
		go srv.Serve(ln)
		defer srv.Close()
		env = append(env, "FULFILLMENT_URL=http://"+ln.Addr().String()+"/shipments")
	}

	// A supervisor per receiver owns its process: it starts it, kills it
	// when asked, and restarts it whenever it is gone.
	sups := make([]*supervisor, receivers)
	urls := make([]string, receivers)
	for i := range sups {
		addr, err := localaddr.Free()
		if err != nil {
			return res, err
		}
		l := &launcher{bin: bin, addr: addr, env: env, log: &childproc.Output{Max: 256 << 10}}
		sups[i] = &supervisor{l: l, rng: mrand.New(mrand.NewPCG(cfg.Seed+uint64(i), 0x73757076)), cfg: cfg,
			killReq: make(chan chan struct{}), up: make(chan struct{})}
		if receivers > 1 {
			sups[i].name = fmt.Sprintf("receiver %d/%d: ", i+1, receivers)
		}
		urls[i] = "http://" + addr + "/webhooks/stripe"
	}
	supCtx, stopSup := context.WithCancel(ctx)
	supDone := make(chan error, receivers)
	for _, sup := range sups {
		go func() { supDone <- sup.loop(supCtx, logf) }()
	}
	for _, sup := range sups {
		select {
		case <-sup.up:
		case err := <-supDone:
			stopSup()
			for range receivers - 1 {
				<-supDone
			}
			return res, fmt.Errorf("start example: %w", err)
		}
	}
	logf("%d receiver(s) listening on %s; sending %d events (%d duplicate deliveries) with %d senders, %d kills",
		receivers, strings.Join(urls, " "), len(p.events), p.duplicates, cfg.Senders, cfg.Kills)

	prov := newProvider(urls, secret, cfg.Senders*3)
	progress := &prov.acked
	sendCtx, stopSend := context.WithCancel(ctx)
	waitSent := p.send(sendCtx, cfg.Senders, func(ctx context.Context, e *event) { prov.deliver(ctx, e) })

	// Kills at random points of the run's progress, so that they land
	// during traffic however fast the machine is, each on a receiver drawn
	// at random; one database restart halfway.
	chaosDone := make(chan struct{})
	var trafficDone atomic.Bool
	var dbRestarts atomic.Int32
	var restartErr error // set before chaosDone is closed
	restartDB := func() {
		if cfg.RestartDB == nil || restartErr != nil || dbRestarts.Load() > 0 {
			return
		}
		logf("restarting PostgreSQL (immediate mode) at %d/%d events", progress.Load(), len(p.events))
		if restartErr = cfg.RestartDB(sendCtx); restartErr == nil {
			dbRestarts.Add(1)
		}
	}
	go func() {
		defer close(chaosDone)
		n := int64(len(p.events))
		victims := make([]int, cfg.Kills)
		if len(sups) > 1 {
			for i := range victims {
				victims[i] = rng.IntN(len(sups))
			}
		}
		marks := make([]int64, cfg.Kills)
		for i := range marks {
			marks[i] = n/50 + rng.Int64N(max(1, n*9/10))
		}
		slices.Sort(marks)
		dbMark := n / 2
		for i, m := range marks {
			// Once the traffic is done, the kills left are made at once:
			// a fast machine can send every event before the receivers
			// are back from the earlier kills.
			for progress.Load() < m && !trafficDone.Load() {
				if sendCtx.Err() != nil {
					return
				}
				if progress.Load() >= dbMark {
					restartDB()
				}
				time.Sleep(2 * time.Millisecond)
			}
			time.Sleep(time.Duration(rng.Int64N(int64(20 * time.Millisecond))))
			if !sups[victims[i]].kill(sendCtx) {
				return
			}
			if (i+1)%10 == 0 {
				logf("%d kills, %d/%d events acknowledged", i+1, progress.Load(), n)
			}
		}
		// Every kill came before halfway: restart once halfway all the same.
		for progress.Load() < dbMark && !trafficDone.Load() && sendCtx.Err() == nil {
			time.Sleep(2 * time.Millisecond)
		}
		if sendCtx.Err() == nil {
			restartDB()
		}
	}()

	waitSent()
	trafficDone.Store(true)
	<-chaosDone
	// Every kill is followed by its restart before the supervisors stop.
	for _, sup := range sups {
		for sup.restarting.Load() && sendCtx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
	}
	stopSend()
	stopSup()
	var supErr error
	for range receivers {
		if err := <-supDone; err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			supErr = errors.Join(supErr, err)
		}
	}
	if supErr != nil {
		return res, fmt.Errorf("supervise example: %w", supErr)
	}
	if restartErr != nil {
		return res, fmt.Errorf("restart PostgreSQL: %w", restartErr)
	}
	var otherLogs []string
	for i, sup := range sups {
		res.Kills += sup.kills
		res.KillsPerReceiver = append(res.KillsPerReceiver, sup.kills)
		res.CrashExits += sup.crashExits
		res.OtherExits += sup.otherExits
		res.Restarts += sup.starts - 1
		if sup.otherExits > 0 {
			otherLogs = append(otherLogs, fmt.Sprintf("receiver %d of %d exited on its own %d times; last log lines:\n%s", i+1, receivers, sup.otherExits, sup.l.log.Tail(20)))
		}
	}
	res.DBRestarts = int(dbRestarts.Load())
	res.Deliveries = prov.attempts.Load()
	res.Rejected = prov.rejected.Load()
	for _, e := range p.events {
		if !e.acked.Load() {
			res.Unacked++
		}
	}
	logf("traffic done: %d deliveries, %d unacknowledged events; checking the database", res.Deliveries, res.Unacked)

	vctx, vcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer vcancel()
	var shipped map[string][]string
	if fs != nil {
		res.FulfillmentCalls, res.FulfillmentRepeats, shipped = fs.snapshot()
	}
	if err := verify(vctx, cfg.DatabaseURL, tag, p.events, shipped, !cfg.Naive, &res); err != nil {
		return res, err
	}
	res.Problems = append(res.Problems, otherLogs...)
	if res.Rejected > 0 {
		res.Problems = append(res.Problems, fmt.Sprintf("%d deliveries were rejected with 4xx", res.Rejected))
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

// supervisor keeps the example running: it starts it, kills it on request,
// and restarts it after every death, sometimes with a crash point armed.
type supervisor struct {
	l       *launcher
	rng     *mrand.Rand
	cfg     config
	killReq chan chan struct{} // a kill, answered once restarting is set
	up      chan struct{}      // closed once the first start succeeded
	// name prefixes its log lines when the run has several receivers.
	name string

	starts, kills, crashExits, otherExits, armed int
	// restarting is set from a kill until the next start succeeded.
	restarting atomic.Bool
}

// maxStartFailures bounds consecutive failed starts (the database may be
// restarting).
const maxStartFailures = 100

// kill asks the supervisor to kill its process (it restarts it), and
// reports false when ctx ended first. Once it returns true, restarting is
// set until the restart succeeded, so that a run waiting for every kill's
// restart cannot miss this one.
func (s *supervisor) kill(ctx context.Context) bool {
	done := make(chan struct{})
	select {
	case s.killReq <- done:
		<-done
		return true
	case <-ctx.Done():
		return false
	}
}

func (s *supervisor) loop(ctx context.Context, logf func(string, ...any)) error {
	failures := 0
	for {
		point := ""
		if s.starts > 0 && len(s.cfg.CrashPoints) > 0 && s.rng.Float64() < s.cfg.CrashRate &&
			(s.cfg.CrashLimit == 0 || s.armed < s.cfg.CrashLimit) {
			point = string(s.cfg.CrashPoints[s.rng.IntN(len(s.cfg.CrashPoints))])
			s.armed++
			logf("%srestart %d with %s=%s", s.name, s.starts, txhooktest.CrashPointEnv, point)
		}
		p, err := s.l.start(ctx, point)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if failures++; failures > maxStartFailures {
				return fmt.Errorf("%w; last log lines:\n%s", err, s.l.log.Tail(20))
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		failures = 0
		if s.starts == 0 {
			close(s.up)
		}
		s.starts++
		s.restarting.Store(false)
		select {
		case done := <-s.killReq:
			s.restarting.Store(true)
			close(done)
			p.Kill()
			s.kills++
		case <-p.Done():
			if p.ExitCode() == txhooktest.CrashExitCode {
				s.crashExits++
			} else {
				s.otherExits++
				logf("%sexample exited on its own (%v)", s.name, p.Err())
			}
		case <-ctx.Done():
			p.Kill()
			return ctx.Err()
		}
	}
}

// orDiscard returns log, or a function that discards its lines when log is
// nil.
func orDiscard(log func(string, ...any)) func(string, ...any) {
	if log == nil {
		return func(string, ...any) {}
	}
	return log
}

// buildReceiver builds pkg into a new temporary folder and returns its
// binary and a function that removes the folder.
func buildReceiver(ctx context.Context, logf func(string, ...any), pkg string) (bin string, remove func(), err error) {
	dir, err := os.MkdirTemp("", "txhook-chaos-")
	if err != nil {
		return "", nil, fmt.Errorf("create temp dir: %w", err)
	}
	logf("building %s", pkg)
	bins, err := childproc.Build(ctx, dir, pkg)
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	return bins[pkg], func() { os.RemoveAll(dir) }, nil
}

func randomTag() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}
