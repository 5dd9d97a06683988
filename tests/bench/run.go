package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	examplemigrations "github.com/txhook/txhook/examples/stripe-orders/migrations"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/internal/childproc"
	"github.com/txhook/txhook/internal/localaddr"
	"github.com/txhook/txhook/internal/pgcluster"
	"github.com/txhook/txhook/migrations"
)

// Scenario names, as they appear in the report.
const (
	scenLimit        = "limit (pgbench)"
	scenLimitPipe    = "limit, pipelined as txhook sends it (pgbench)"
	scenNaive        = "naive dedupe"
	scenLibrary      = "txhook library"
	scenLibraryFirst = "txhook library, dedupe step first"
	scenLibraryDup   = "duplicate storm (library)"
	scenLibraryDupDB = "duplicate storm (library, no memory)"
	scenHTTP         = "txhook HTTP"
	scenHTTPMulti    = "txhook HTTP, 3 receivers"
	scenHTTPDup      = "duplicate storm (HTTP)"
	scenBaselineHTTP = "baseline pgx HTTP"
	scenRawPgx       = "pgx, same SQL, no txhook"
	scenBatchPgx     = "pgx batch, 1 round trip"
)

// httpReceivers is how many example processes serve scenHTTPMulti, on the
// same database behind the round-robin load generator.
const httpReceivers = 3

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
	dupProfile  profileSummary // the example under redeliveries at profConc
	profConc    int
	micro       string
	rowCost     []rowCost // what the events row costs the server, part by part
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
		// Every receiver of a concurrency's rows keeps its pool open across
		// the interleaved rounds: at 32 they and pgbench hold about 330 connections.
		c, err := pgcluster.StartDurable(ctx, "max_connections=1000")
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
	var scripts [2]string // one round trip per statement; pipelined as txhook sends them
	for i, pipelined := range []bool{false, true} {
		if scripts[i], err = writePgbenchScript(dir, sample, customers, pipelined); err != nil {
			return err
		}
	}
	havePgbench := true
	if _, err := exec.LookPath("pgbench"); err != nil {
		havePgbench = false
		logf("pgbench not found: no limit row, ratios left out")
	}

	if o.amqp && !o.onlyInbox {
		node, stop, err := amqpBroker(ctx)
		if err != nil {
			return fmt.Errorf("RabbitMQ for the AMQP rows (or -amqp=false): %w", err)
		}
		defer stop()
		o.amqpNode = node
	}
	for _, c := range o.conc {
		cells, err := atConcurrency(ctx, o, dbURL, c, exampleBin, self, scripts, havePgbench)
		if err != nil {
			return err
		}
		rep.add(cells...)
	}
	if o.rowCost && !o.onlyInbox && !o.onlyNATS && o.only == nil {
		logf("what the events row costs the server")
		if rep.rowCost, err = measureRowCost(ctx, o, dbURL); err != nil {
			return fmt.Errorf("row cost: %w", err)
		}
	}
	if o.profile {
		rep.profConc = profileConcurrency
		if rep.profile, err = profileLibrary(ctx, o, dbURL, profileConcurrency); err != nil {
			logf("profile the library: %v", err)
		}
		if rep.httpProfile, err = profileExample(ctx, o, dbURL, exampleBin, profileConcurrency, false); err != nil {
			logf("profile the example: %v", err)
		}
		if rep.dupProfile, err = profileExample(ctx, o, dbURL, exampleBin, profileConcurrency, true); err != nil {
			logf("profile the example's duplicate path: %v", err)
		}
	}
	if o.micro {
		logf("Go micro-benchmarks")
		rep.micro = microBenchmarks(ctx, o.root, o.serverURL)
	}
	rep.finished = time.Now()
	// The scale section belongs to make bench-scale: keep it.
	old, _ := os.ReadFile(o.out)
	doc := rep.markdown()
	if s := scaleSectionOf(string(old)); s != "" {
		doc = withScaleSection(doc, s[len(scaleBegin):len(s)-len(scaleEnd)-1])
	}
	if err := os.WriteFile(o.out, []byte(doc), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	logf("wrote %s", o.out)
	return nil
}

func (r *report) add(cells ...cell) {
	for _, c := range cells {
		logf("c=%-3d %-26s %8.0f events/s (median)  p50 %-9v p99 %-9v errors %d", c.Concurrency, c.Scenario, c.rate(),
			c.P50.Round(10*time.Microsecond), c.P99.Round(10*time.Microsecond), c.Errors)
		r.cells = append(r.cells, c)
	}
}

// scenario is one row of the report at one concurrency: measure runs one
// round of it.
type scenario struct {
	name    string
	measure func(ctx context.Context) (sample, error)
}

// atConcurrency measures every scenario at concurrency c: o.rounds rounds,
// each running the scenarios one after the other, so that a change in the
// machine's load touches every row alike; a row's rate is the median of its
// rounds.
func atConcurrency(ctx context.Context, o options, dbURL string, c int, exampleBin, self string, scripts [2]string, havePgbench bool) ([]cell, error) {
	pool, proc, err := openPool(ctx, dbURL, c)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	procFirst, err := txhook.NewProcessor(pool, &txhook.Config{StorePayload: true})
	if err != nil {
		return nil, err
	}
	procNoMemory, err := txhook.NewProcessor(pool, &txhook.Config{StorePayload: true, DedupeWithFirstStatement: true, RecentKeys: -1})
	if err != nil {
		return nil, err
	}
	example, err := startReceiver(ctx, o, dbURL, c, 1, scenHTTP, exampleBin, nil, "")
	if err != nil {
		return nil, err
	}
	defer example.stop()
	examples, err := startReceiver(ctx, o, dbURL, c, httpReceivers, scenHTTPMulti, exampleBin, nil, "")
	if err != nil {
		return nil, err
	}
	defer examples.stop()
	baseline, err := startReceiver(ctx, o, dbURL, c, 1, scenBaselineHTTP, self, []string{baselineEnv + "=1"}, "")
	if err != nil {
		return nil, err
	}
	defer baseline.stop()

	// newEvents returns a scenario running fn for new events of its own, counting
	// them per worker in next.
	newEvents := func(name, prefix string, recv *receiver, fn func(ctx context.Context, key string, body []byte) error) (scenario, []int) {
		src := eventSource{prefix: o.tag + prefix + strconv.Itoa(c), customers: customers}
		next := make([]int, c)
		return scenario{name: name, measure: func(ctx context.Context) (sample, error) {
			return measure(ctx, c, o.warmup, o.duration, recv, func(ctx context.Context, w int) error {
				key, body := src.next(w, next[w])
				next[w]++
				return fn(ctx, key, body)
			}), nil
		}}, next
	}
	// redeliveries returns a scenario running fn for events already sent by
	// the scenario whose counters are done.
	redeliveries := func(name, prefix string, done []int, recv *receiver, fn func(ctx context.Context, key string, body []byte) error) scenario {
		src := eventSource{prefix: o.tag + prefix + strconv.Itoa(c), customers: customers}
		return scenario{name: name, measure: func(ctx context.Context) (sample, error) {
			return measure(ctx, c, o.warmup, o.duration, recv, func(ctx context.Context, w int) error {
				dw := rand.IntN(c)
				if done[dw] == 0 {
					return errors.New("no processed event to redeliver")
				}
				key, body := src.next(dw, rand.IntN(done[dw]))
				return fn(ctx, key, body)
			}), nil
		}}
	}

	var list []scenario
	if havePgbench {
		list = append(list, scenario{name: scenLimit, measure: func(ctx context.Context) (sample, error) {
			return runPgbench(ctx, o.tmp, scripts[0], dbURL, c, o.duration)
		}}, scenario{name: scenLimitPipe, measure: func(ctx context.Context) (sample, error) {
			return runPgbench(ctx, o.tmp, scripts[1], dbURL, c, o.duration)
		}})
	}
	naive, _ := newEvents(scenNaive, "naive", nil, func(ctx context.Context, key string, body []byte) error {
		return processNaive(ctx, pool, key, body)
	})
	raw, _ := newEvents(scenRawPgx, "raw", nil, func(ctx context.Context, key string, body []byte) error {
		return processRawPgx(ctx, pool, key, body)
	})
	batch, _ := newEvents(scenBatchPgx, "batch", nil, func(ctx context.Context, key string, body []byte) error {
		return processBatchPgx(ctx, pool, key, body)
	})
	lib, libDone := newEvents(scenLibrary, "lib", nil, func(ctx context.Context, key string, body []byte) error {
		return processLibrary(ctx, proc, key, body, txhook.OutcomeProcessed)
	})
	libFirst, _ := newEvents(scenLibraryFirst, "libfirst", nil, func(ctx context.Context, key string, body []byte) error {
		return processLibrary(ctx, procFirst, key, body, txhook.OutcomeProcessed)
	})
	libDup := redeliveries(scenLibraryDup, "lib", libDone, nil, func(ctx context.Context, key string, body []byte) error {
		return processLibrary(ctx, proc, key, body, txhook.OutcomeDuplicate)
	})
	libDupDB := redeliveries(scenLibraryDupDB, "lib", libDone, nil, func(ctx context.Context, key string, body []byte) error {
		return processLibrary(ctx, procNoMemory, key, body, txhook.OutcomeDuplicate)
	})
	httpNew, httpDone := newEvents(scenHTTP, "http", example.recv, func(ctx context.Context, _ string, body []byte) error {
		return example.post(ctx, body)
	})
	httpMulti, _ := newEvents(scenHTTPMulti, "httpmulti", examples.recv, func(ctx context.Context, _ string, body []byte) error {
		return examples.post(ctx, body)
	})
	httpDup := redeliveries(scenHTTPDup, "http", httpDone, example.recv, func(ctx context.Context, _ string, body []byte) error {
		return example.post(ctx, body)
	})
	base, _ := newEvents(scenBaselineHTTP, "base", baseline.recv, func(ctx context.Context, _ string, body []byte) error {
		return baseline.post(ctx, body)
	})
	// Rows compared in a ratio of the report sit next to each other.
	list = append(list, naive, raw, batch, lib, libFirst, libDup, libDupDB, httpNew, base, httpMulti, httpDup)
	if o.inbox || o.onlyInbox {
		ib, err := newInboxBench(ctx, dbURL, c)
		if err != nil {
			return nil, fmt.Errorf("inbox rows at concurrency %d: %w", c, err)
		}
		defer ib.stop()
		if o.onlyInbox {
			list = nil
		}
		list = append(list, inboxScenarios(o, c, ib)...)
	}
	if o.amqpNode != nil {
		ab, err := newAMQPBench(ctx, o.amqpNode, dbURL, o.tag, c)
		if err != nil {
			return nil, fmt.Errorf("AMQP rows at concurrency %d: %w", c, err)
		}
		defer ab.stop()
		list = append(list, amqpScenarios(o, c, ab)...)
	}
	if o.nats || o.onlyNATS {
		nb, err := newNATSBench(ctx, dbURL, c)
		if err != nil {
			return nil, fmt.Errorf("NATS rows at concurrency %d: %w", c, err)
		}
		defer nb.stop()
		if o.onlyNATS {
			list = nil
		}
		list = append(list, natsScenarios(o, c, nb)...)
	}

	if o.only != nil {
		list = slices.DeleteFunc(list, func(sc scenario) bool { return !o.only.MatchString(sc.name) })
	}
	probe, err := newDBProbe(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer probe.close()
	rounds := map[string][]sample{}
	for r := range o.rounds {
		// Every other round runs the rows in reverse order: a row that
		// follows a costly one (a broker's or the database's work left
		// over, despite the CHECKPOINT and the autovacuum wait) precedes it
		// in the next round, and two rows compared (adjacent in the list)
		// take turns running first.
		order := list
		if r%2 == 1 {
			order = slices.Clone(list)
			slices.Reverse(order)
		}
		for _, sc := range order {
			checkpoint(ctx, dbURL)
			before, err := probe.read(ctx)
			if err != nil {
				return nil, err
			}
			s, err := sc.measure(ctx)
			if err != nil {
				return nil, fmt.Errorf("%s at concurrency %d: %w", sc.name, c, err)
			}
			after, err := probe.read(ctx)
			if err != nil {
				return nil, err
			}
			s.db = between(before, after)
			if c == profileConcurrency && r == o.rounds-1 {
				s.walRels = probe.walByRelation(ctx, before, after, s.total)
			}
			logf("c=%-3d round %d/%d %-26s %8.0f events/s", c, r+1, o.rounds, sc.name, s.rate())
			rounds[sc.name] = append(rounds[sc.name], s)
		}
	}
	var out []cell
	for _, sc := range list {
		out = append(out, merge(sc.name, c, rounds[sc.name]))
	}
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
	proc, err := txhook.NewProcessor(pool, &txhook.Config{StorePayload: true, DedupeWithFirstStatement: true})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, proc, nil
}

// httpTarget is a receiver running as a child process.
type httpTarget struct {
	recv *receiver
	post func(ctx context.Context, body []byte) error
	stop func()
}

// startReceiver starts n processes of bin (the example, or this binary as
// the baseline) on free ports, all on the database at dbURL, and returns
// them with a load generator's post function for c concurrent clients: it
// signs each body as Stripe does, sends each request to the next process in
// turn (round robin, as a load balancer would), and expects 200. Each
// process has a pool of c/n connections, rounded up, so that the processes
// together hold about the c connections of every other row. With
// cpuProfile set, the first process (the example built with the
// instrumenting overlay) writes a CPU profile of profileDuration there once
// sent SIGUSR2.
func startReceiver(ctx context.Context, o options, dbURL string, c, n int, name, bin string, env []string, cpuProfile string) (*httpTarget, error) {
	secret := "whsec_bench_" + strconv.Itoa(rand.IntN(1<<30))
	poolURL, err := withPoolSize(dbURL, (c+n-1)/n)
	if err != nil {
		return nil, err
	}
	env = append(env, "DATABASE_URL="+poolURL, "STRIPE_WEBHOOK_SECRET="+secret)
	var (
		procs     []*childproc.Process
		mallocs   []string
		endpoints []string
		stops     []func()
	)
	stop := func() {
		for _, s := range stops {
			s()
		}
	}
	for i := range n {
		pname := name + " receiver"
		if n > 1 {
			pname = fmt.Sprintf("%s receiver %d/%d", name, i+1, n)
		}
		profile := ""
		if i == 0 {
			profile = cpuProfile
		}
		proc, mallocFile, stopProc, err := startProcess(ctx, o, pname, bin, env, profile)
		if err != nil {
			stop()
			return nil, err
		}
		procs, mallocs, stops = append(procs, proc.p), append(mallocs, mallocFile), append(stops, stopProc)
		endpoints = append(endpoints, "http://"+proc.addr+"/webhooks/stripe")
	}
	client := &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{MaxIdleConns: n * c, MaxIdleConnsPerHost: c, DisableCompression: true},
	}
	signer := &handler.Stripe{Secrets: []string{secret}}
	var turn atomic.Uint64
	post := func(ctx context.Context, body []byte) error {
		endpoint := endpoints[(turn.Add(1)-1)%uint64(n)]
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
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
	recv := &receiver{mallocs: func() (uint64, error) {
		var sum uint64
		for i, p := range procs {
			m, err := readMallocs(p, mallocs[i])
			if err != nil {
				return 0, err
			}
			sum += m
		}
		return sum, nil
	}}
	for _, p := range procs {
		recv.pids = append(recv.pids, p.Pid())
	}
	return &httpTarget{recv: recv, post: post, stop: stop}, nil
}

// startedProcess is a receiver process and its address.
type startedProcess struct {
	p    *childproc.Process
	addr string
}

// startProcess starts one receiver process of bin with env on a free port
// and returns it, the file it reports its allocations to, and a function
// that stops it. With cpuProfile set it profiles itself on SIGUSR2 (see
// instrumentOverlay).
func startProcess(ctx context.Context, o options, name, bin string, env []string, cpuProfile string) (startedProcess, string, func(), error) {
	addr, err := localaddr.Free()
	if err != nil {
		return startedProcess{}, "", nil, err
	}
	mallocFile := filepath.Join(o.tmp, "mallocs-"+strconv.Itoa(rand.IntN(1<<30)))
	env = append(slices.Clone(env), "ADDR="+addr, mallocsEnv+"="+mallocFile)
	if cpuProfile != "" {
		env = append(env, profileEnv+"="+cpuProfile, profileSecondsEnv+"="+strconv.Itoa(int(profileDuration.Seconds())))
	}
	// The example logs every delivery: to a file, so that reading it costs
	// this process nothing, in memory where the machine has /dev/shm, so
	// that appending to it does not add file system work on the database's
	// disk, which production hands to a log pipeline.
	logFile, err := os.CreateTemp(logDir(o.tmp), "txhook-bench-receiver-log-")
	if err != nil {
		return startedProcess{}, "", nil, err
	}
	closeLog := func() {
		logFile.Close()
		os.Remove(logFile.Name())
	}
	proc, err := childproc.Start(ctx, childproc.Spec{
		Name:   name,
		Bin:    bin,
		Env:    childproc.Env(env...),
		Addr:   addr,
		Output: logFile,
	})
	if err != nil {
		b, _ := os.ReadFile(logFile.Name())
		closeLog()
		return startedProcess{}, "", nil, fmt.Errorf("%w\n%s", err, b[max(0, len(b)-4096):])
	}
	stop := func() {
		proc.Stop(10 * time.Second)
		closeLog()
	}
	return startedProcess{p: proc, addr: addr}, mallocFile, stop, nil
}

// withPoolSize returns dbURL with pgxpool's pool_max_conns and
// pool_min_conns set to n.
func withPoolSize(dbURL string, n int) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", fmt.Errorf("parse database URL: %w", err)
	}
	q := u.Query()
	q.Set("pool_max_conns", strconv.Itoa(n))
	q.Set("pool_min_conns", strconv.Itoa(n))
	u.RawQuery = q.Encode()
	return u.String(), nil
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

// vacuumWait bounds how long checkpoint waits for autovacuum.
const vacuumWait = 20 * time.Second

// checkpoint waits, at most vacuumWait, until no autovacuum worker runs,
// then flushes dirty buffers, so that a cell does not pay for the previous
// ones' writes, nor, most likely, for the vacuum they started (after the
// inbox rows, whose updates of River's job table and its GIN index start
// vacuums, the next rows wrote WAL to River's tables they never touch).
func checkpoint(ctx context.Context, dbURL string) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		logf("checkpoint: %v", err)
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	start := time.Now()
	for {
		var workers int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'").Scan(&workers); err != nil {
			logf("checkpoint: %v", err)
			break
		}
		if workers == 0 || time.Since(start) > vacuumWait {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if waited := time.Since(start); waited > time.Second {
		logf("waited %v for autovacuum before the cell", waited.Round(100*time.Millisecond))
	}
	if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
		logf("checkpoint: %v", err)
	}
}

// logDir is where the receivers' logs go: /dev/shm (memory) when usable,
// otherwise fallback.
func logDir(fallback string) string {
	const shm = "/dev/shm"
	f, err := os.CreateTemp(shm, "txhook-bench-probe-")
	if err != nil {
		return fallback
	}
	f.Close()
	os.Remove(f.Name())
	return shm
}
