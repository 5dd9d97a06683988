package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	examplemigrations "github.com/txhook/txhook/examples/stripe-orders/migrations"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/internal/pgcluster"
	"github.com/txhook/txhook/migrations"
)

// Scenario names, as they appear in the report.
const (
	scenLimit        = "limit (pgbench)"
	scenNaive        = "naive dedupe"
	scenLibrary      = "txhook library"
	scenLibraryDup   = "duplicate storm (library)"
	scenHTTP         = "txhook HTTP"
	scenHTTPDup      = "duplicate storm (HTTP)"
	scenBaselineHTTP = "baseline pgx HTTP"
	scenRawPgx       = "pgx, same SQL, no txhook"
	scenBatchPgx     = "pgx batch, 1 round trip"
)

// customers is how many customers the events are spread over.
const customers = 1000

const stripeOrdersPkg = "github.com/txhook/txhook/examples/stripe-orders"

// report is everything the run measured, for writing BENCHMARKS.md.
type report struct {
	started     time.Time
	finished    time.Time
	opts        options
	machine     []string
	pgInfo      []string
	cells       []cell
	profile     profileSummary // the library at profConc
	httpProfile profileSummary // the example under HTTP load at profConc
	profConc    int
	micro       string
	payload     int
}

func run(ctx context.Context, o options) error {
	rep := &report{started: time.Now(), opts: o, machine: machineInfo()}
	dir, err := os.MkdirTemp("", "txhook-bench-")
	if err != nil {
		return fmt.Errorf("create temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	o.tmp = dir
	// Event keys carry the run's tag, so that runs on the same database
	// (DATABASE_URL) never redeliver each other's events.
	o.tag = fmt.Sprintf("r%x_", time.Now().Unix())

	dbURL := o.dbURL
	if dbURL == "" {
		logf("starting a throwaway PostgreSQL with default durability settings")
		c, err := pgcluster.StartDurable(ctx)
		if err != nil {
			return fmt.Errorf("start PostgreSQL (or set DATABASE_URL): %w", err)
		}
		defer c.Stop()
		if dbURL, err = createDatabase(ctx, c.URL, "txhook_bench"); err != nil {
			return err
		}
		o.serverURL = c.URL
	}
	if err := prepare(ctx, dbURL); err != nil {
		return err
	}
	if rep.pgInfo, err = postgresInfo(ctx, dbURL); err != nil {
		return err
	}

	logf("building the stripe-orders example")
	exampleBin, err := buildInstrumentedExample(ctx, o.root, dir)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own binary: %w", err)
	}

	_, sample := eventSource{prefix: o.tag + "lib8", customers: customers}.next(0, 0)
	rep.payload = len(sample)
	script, err := writePgbenchScript(dir, sample, customers)
	if err != nil {
		return err
	}
	havePgbench := true
	if _, err := exec.LookPath("pgbench"); err != nil {
		havePgbench = false
		logf("pgbench not found: no limit row, ratios left out")
	}

	for _, c := range o.conc {
		if havePgbench {
			checkpoint(ctx, dbURL)
			logf("c=%d %s", c, scenLimit)
			res, err := runPgbench(ctx, dir, script, dbURL, c, o.duration)
			if err != nil {
				return err
			}
			rep.add(res)
		}
		cells, err := inProcess(ctx, o, dbURL, c)
		if err != nil {
			return err
		}
		rep.add(cells...)
		for _, recv := range []struct {
			name string
			bin  string
			env  []string
		}{
			{scenHTTP, exampleBin, nil},
			{scenBaselineHTTP, self, []string{baselineEnv + "=1"}},
		} {
			cells, err := overHTTP(ctx, o, dbURL, c, recv.name, recv.bin, recv.env, "")
			if err != nil {
				return err
			}
			rep.add(cells...)
		}
	}
	if o.profile {
		rep.profConc = profileConcurrency
		if rep.profile, err = profileLibrary(ctx, o, dbURL, profileConcurrency); err != nil {
			logf("profile the library: %v", err)
		}
		if rep.httpProfile, err = profileExample(ctx, o, dbURL, exampleBin, profileConcurrency); err != nil {
			logf("profile the example: %v", err)
		}
	}
	if o.micro {
		logf("Go micro-benchmarks")
		rep.micro = microBenchmarks(ctx, o.root, o.serverURL)
	}
	rep.finished = time.Now()
	if err := os.WriteFile(o.out, []byte(rep.markdown()), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	logf("wrote %s", o.out)
	return nil
}

func (r *report) add(cells ...cell) {
	for _, c := range cells {
		logf("  %-26s c=%-3d %8.0f events/s  p50 %-9v p99 %-9v errors %d", c.Scenario, c.Concurrency, c.rate(),
			c.P50.Round(10*time.Microsecond), c.P99.Round(10*time.Microsecond), c.Errors)
		r.cells = append(r.cells, c)
	}
}

// inProcess measures the naive dedupe, the library and the library's
// duplicate path at concurrency c, each with a pool of c connections.
func inProcess(ctx context.Context, o options, dbURL string, c int) ([]cell, error) {
	pool, proc, err := openPool(ctx, dbURL, c)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	var out []cell

	src := eventSource{prefix: o.tag + "naive" + strconv.Itoa(c), customers: customers}
	next := make([]int, c)
	checkpoint(ctx, dbURL)
	logf("c=%d %s", c, scenNaive)
	out = append(out, measure(ctx, scenNaive, c, o.warmup, o.duration, nil, func(ctx context.Context, w int) error {
		key, body := src.next(w, next[w])
		next[w]++
		return processNaive(ctx, pool, key, body)
	}))

	for _, x := range []struct {
		name, prefix string
		fn           func(context.Context, *pgxpool.Pool, string, []byte) error
	}{{scenRawPgx, "raw", processRawPgx}, {scenBatchPgx, "batch", processBatchPgx}} {
		src := eventSource{prefix: o.tag + x.prefix + strconv.Itoa(c), customers: customers}
		next := make([]int, c)
		checkpoint(ctx, dbURL)
		logf("c=%d %s", c, x.name)
		out = append(out, measure(ctx, x.name, c, o.warmup, o.duration, nil, func(ctx context.Context, w int) error {
			key, body := src.next(w, next[w])
			next[w]++
			return x.fn(ctx, pool, key, body)
		}))
	}

	src = eventSource{prefix: o.tag + "lib" + strconv.Itoa(c), customers: customers}
	next = make([]int, c)
	checkpoint(ctx, dbURL)
	logf("c=%d %s", c, scenLibrary)
	out = append(out, measure(ctx, scenLibrary, c, o.warmup, o.duration, nil, func(ctx context.Context, w int) error {
		key, body := src.next(w, next[w])
		next[w]++
		return processLibrary(ctx, proc, key, body, txhook.OutcomeProcessed)
	}))

	done := next
	checkpoint(ctx, dbURL)
	logf("c=%d %s", c, scenLibraryDup)
	out = append(out, measure(ctx, scenLibraryDup, c, o.warmup, o.duration, nil, func(ctx context.Context, w int) error {
		dw := rand.IntN(c)
		if done[dw] == 0 {
			return errors.New("no processed event to redeliver")
		}
		key, body := src.next(dw, rand.IntN(done[dw]))
		return processLibrary(ctx, proc, key, body, txhook.OutcomeDuplicate)
	}))
	return out, nil
}

// openPool opens a pool of c connections and a processor on it configured
// as the example configures its own.
func openPool(ctx context.Context, dbURL string, c int) (*pgxpool.Pool, *txhook.Processor, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, nil, fmt.Errorf("parse database URL: %w", err)
	}
	cfg.MaxConns, cfg.MinConns = int32(c), int32(c)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("connect: %w", err)
	}
	proc, err := txhook.NewProcessor(pool, &txhook.Config{StorePayload: true})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, proc, nil
}

// overHTTP starts a receiver (the example, or the baseline) and measures new
// events through it, then, for the example, redeliveries of those events.
//
// With cpuProfile set, the receiver (a build with the profiling overlay)
// writes a CPU profile of its first seconds there, and only new events are
// sent.
func overHTTP(ctx context.Context, o options, dbURL string, c int, name, bin string, env []string, cpuProfile string) ([]cell, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	secret := "whsec_bench_" + strconv.Itoa(rand.IntN(1<<30))
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), env...)
	mallocFile := filepath.Join(o.tmp, "mallocs-"+strconv.Itoa(rand.IntN(1<<30)))
	cmd.Env = append(cmd.Env, "DATABASE_URL="+dbURL, "ADDR="+addr, "STRIPE_WEBHOOK_SECRET="+secret, "TXHOOK_CRASH_POINT=", "FULFILLMENT_URL=",
		mallocsEnv+"="+mallocFile)
	if cpuProfile != "" {
		// Stop the profile before the load does, so that it is complete
		// when the receiver is stopped.
		secs := max(1, int((o.warmup+o.duration).Seconds())-1)
		cmd.Env = append(cmd.Env, profileEnv+"="+cpuProfile, profileSecondsEnv+"="+strconv.Itoa(secs))
	}
	// The example logs every delivery: to a file, so that reading it costs
	// this process nothing.
	errLog, err := os.CreateTemp("", "txhook-bench-receiver-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(errLog.Name())
	defer errLog.Close()
	cmd.Stdout, cmd.Stderr = errLog, errLog
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s receiver: %w", name, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	if err := waitListening(addr, exited); err != nil {
		b, _ := os.ReadFile(errLog.Name())
		return nil, fmt.Errorf("%s receiver: %w\n%s", name, err, b[max(0, len(b)-4096):])
	}

	client := &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{MaxIdleConns: c, MaxIdleConnsPerHost: c, DisableCompression: true},
	}
	signer := &handler.Stripe{Secrets: []string{secret}}
	post := func(ctx context.Context, body []byte) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/webhooks/stripe", bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		if err := signer.Sign(req.Header, body, time.Now()); err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		return nil
	}
	prefix := o.tag + "http" + strconv.Itoa(c)
	if env != nil {
		prefix = o.tag + "base" + strconv.Itoa(c)
	}
	src := eventSource{prefix: prefix, customers: customers}
	next := make([]int, c)
	recv := &receiver{pid: cmd.Process.Pid, mallocs: func() (uint64, error) { return readMallocs(cmd.Process, mallocFile) }}
	checkpoint(ctx, dbURL)
	logf("c=%d %s", c, name)
	var out []cell
	cl := measure(ctx, name, c, o.warmup, o.duration, recv, func(ctx context.Context, w int) error {
		_, body := src.next(w, next[w])
		next[w]++
		return post(ctx, body)
	})
	out = append(out, cl)
	if env != nil || cpuProfile != "" {
		return out, nil
	}
	done := next
	var missing atomic.Int64
	checkpoint(ctx, dbURL)
	logf("c=%d %s", c, scenHTTPDup)
	cl = measure(ctx, scenHTTPDup, c, o.warmup, o.duration, recv, func(ctx context.Context, w int) error {
		dw := rand.IntN(c)
		if done[dw] == 0 {
			missing.Add(1)
			return errors.New("no processed event to redeliver")
		}
		_, body := src.next(dw, rand.IntN(done[dw]))
		return post(ctx, body)
	})
	out = append(out, cl)
	return out, nil
}

func waitListening(addr string, exited <-chan struct{}) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return errors.New("exited before listening")
		case <-time.After(20 * time.Millisecond):
		}
		if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			conn.Close()
			return nil
		}
	}
	return errors.New("not listening after 60s")
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// createDatabase creates a fresh database on the server at base and returns
// its URL.
func createDatabase(ctx context.Context, base, name string) (string, error) {
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database: %w", err)
	}
	u, err := url.Parse(base)
	if err != nil {
		return "", err
	}
	u.Path = "/" + name
	return u.String(), nil
}

// prepare applies txhook's and the example's migrations and creates the
// naive and baseline receivers' tables.
func prepare(ctx context.Context, dbURL string) error {
	if err := migrations.Up(ctx, dbURL); err != nil {
		return fmt.Errorf("apply txhook migrations: %w", err)
	}
	if err := examplemigrations.Up(ctx, dbURL); err != nil {
		return fmt.Errorf("apply stripe-orders migrations: %w", err)
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, sql := range []string{
		"CREATE TABLE IF NOT EXISTS naive_processed_events (event_key text PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now())",
		baselineSchema,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("create table: %w", err)
		}
	}
	return nil
}

// checkpoint flushes dirty buffers so that a cell does not pay for the
// previous one's writes.
func checkpoint(ctx context.Context, dbURL string) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		logf("checkpoint: %v", err)
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
		logf("checkpoint: %v", err)
	}
}
