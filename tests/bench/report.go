package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// machineInfo describes the machine: CPU, cores, memory, kernel, Go.
func machineInfo() []string {
	var info []string
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				info = append(info, "CPU: "+strings.TrimSpace(v))
				break
			}
		}
	}
	info = append(info, fmt.Sprintf("logical CPUs: %d", runtime.NumCPU()))
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		info = append(info, "memory: "+strings.Join(strings.Fields(line)[1:], " "))
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		info = append(info, "kernel: Linux "+strings.TrimSpace(string(b)))
	}
	info = append(info, "Go: "+runtime.Version()+" "+runtime.GOOS+"/"+runtime.GOARCH)
	if out, err := exec.Command("pgbench", "--version").Output(); err == nil {
		info = append(info, "pgbench: "+strings.TrimSpace(string(out)))
	}
	return info
}

// postgresSettings are the settings that decide what a commit costs.
var postgresSettings = []string{
	"fsync", "synchronous_commit", "full_page_writes", "wal_sync_method", "wal_level",
	"shared_buffers", "max_wal_size", "checkpoint_timeout", "max_connections",
}

func postgresInfo(ctx context.Context, dbURL string) ([]string, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var version string
	if err := conn.QueryRow(ctx, "SELECT version()").Scan(&version); err != nil {
		return nil, fmt.Errorf("read version: %w", err)
	}
	info := []string{version}
	for _, s := range postgresSettings {
		var v string
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", s).Scan(&v); err != nil {
			return nil, fmt.Errorf("read %s: %w", s, err)
		}
		info = append(info, s+" = "+v)
	}
	return info, nil
}

// microBenchmarks runs the Go micro-benchmarks of the hot paths in the
// repository at root and returns their output (or the error). The ones
// that need PostgreSQL create their databases on the server at serverURL,
// or, when it is empty, where TEST_DATABASE_URL says (a throwaway cluster
// when unset): never on an application's server.
func microBenchmarks(ctx context.Context, root, serverURL string) string {
	cmd := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-bench", "^Benchmark(Process|Stripe)", "-benchmem", "-count", "1", ".", "./handler/")
	cmd.Dir = root
	cmd.Env = os.Environ()
	if serverURL != "" {
		cmd.Env = append(cmd.Env, "TEST_DATABASE_URL="+serverURL)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Sprintf("go test -bench failed: %v\n%s", err, out)
	}
	var keep []string
	for line := range strings.SplitSeq(string(out), "\n") {
		if strings.HasPrefix(line, "Benchmark") || strings.HasPrefix(line, "pkg:") || strings.HasPrefix(line, "cpu:") {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}

// find returns the cell of scenario s at concurrency c.
func (r *report) find(s string, c int) (cell, bool) {
	for _, x := range r.cells {
		if x.Scenario == s && x.Concurrency == c {
			return x, true
		}
	}
	return cell{}, false
}

// ratio returns the median of a's rate over b's, round by round (see
// roundRatios), 0 when either is missing.
func (r *report) ratio(a, b string, c int) float64 {
	return median(r.roundRatios(a, b, c))
}

// roundRatios returns a's rate over b's in each round at concurrency c:
// rows of one round ran minutes apart at most, rows of different rounds
// up to the whole concurrency's time apart, and the machine's speed drifts
// by more than the differences measured (the rounds of one row spread by
// up to 3× on a busy day). A ratio taken within each round cancels most of
// that drift; a ratio of the rows' medians, taken from different rounds,
// does not. None when either row is missing.
func (r *report) roundRatios(a, b string, c int) []float64 {
	x, ok1 := r.find(a, c)
	y, ok2 := r.find(b, c)
	if !ok1 || !ok2 {
		return nil
	}
	var out []float64
	for i := range min(len(x.Rates), len(y.Rates)) {
		if y.Rates[i] > 0 {
			out = append(out, x.Rates[i]/y.Rates[i])
		}
	}
	return out
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }

func (r *report) markdown() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("# Benchmarks")
	p("")
	p("Written by `make bench` (`go run ./bench` in the tests module) on %s, run from %s to %s UTC.",
		r.started.UTC().Format("2006-01-02"), r.started.UTC().Format("15:04:05"), r.finished.UTC().Format("15:04:05"))
	p("Every row ran on the same PostgreSQL server, in one run. At each concurrency the rows ran in %d round(s), one after the", r.opts.rounds)
	p("other within a round (every other round in reverse order, so that two rows compared take turns running first), so")
	p("that a change in the machine's load touches every row alike; each round of a row measured %v after %v of", r.opts.duration, r.opts.warmup)
	p("warm-up, with a CHECKPOINT before it, once any autovacuum the earlier rows started had ended (waiting %v at most).", vacuumWait)
	p("A row's events/s is the median of its rounds (all rounds are listed); its latencies, allocations and CPU cover all")
	p("its rounds. A ratio of two rows is the median of their ratios round by round (each round's two rows ran minutes")
	p("apart at most, where the machine's speed drifts far more across the rounds), so it can differ from the ratio of the")
	p("two rows' events/s. Numbers are from this run only; rerun `make bench` to reproduce them on your machine.")
	p("")
	p("## Machine")
	p("")
	for _, m := range r.machine {
		p("- %s", m)
	}
	p("- the load generator, the receivers and PostgreSQL all share these CPUs")
	p("")
	p("## PostgreSQL")
	p("")
	for _, s := range r.pgInfo {
		p("- %s", s)
	}
	if r.opts.dbURL == "" {
		p("- a throwaway cluster (initdb) with PostgreSQL's default durability settings: every commit waits for its WAL flush")
	} else {
		p("- the server at DATABASE_URL")
	}
	p("")
	p("## What each row measures")
	p("")
	p("Each event is a `checkout.session.completed` whose processing is the stripe-orders example's: the dedupe step, an")
	p("order insert and an upsert adding to the customer's running total (%d customers), in one transaction, with the event's", customers)
	p("%d-byte body stored (the example keeps payloads for replay). Concurrency c means c concurrent clients.", r.payload)
	p("")
	p("- **%s**: pgbench `-M prepared`, c connections, running exactly the SQL the library sends for one event", scenLimit)
	p("  (BEGIN; the dedupe step's insert, which bounds its own lock wait and fails for a recorded key; the example's")
	p("  InsertOrder; AddCustomerSpend;")
	p("  COMMIT), each statement a round trip of its own (five): the database's own limit, and the reference of every")
	p("  ratio to the limit.")
	p("- **%s**: the same script in one pipeline (`\\startpipeline`): the one round trip txhook sends for the", scenLimitPipe)
	p("  example.")
	p("- **%s**: the key inserted and committed alone, then the work in a second transaction (fast and wrong: a", scenNaive)
	p("  crash between the two loses the event); pgxpool of c connections.")
	p("- **%s**: `Processor.Process` called directly with the example's handler (JSON decode and the same", scenLibrary)
	p("  writes through its sqlc queries) and the example's configuration; pgxpool of c connections. With")
	p("  `DedupeWithFirstStatement` and both of the handler's writes deferred (`txhook.Deferred`), txhook sends BEGIN,")
	p("  the dedupe step, the writes and COMMIT in one round trip (a pgx batch); for a recorded key the dedupe step")
	p("  fails and the server skips the rest.")
	p("- **%s**: the same without `DedupeWithFirstStatement` (the default: the key is known new before the", scenLibraryFirst)
	p("  handler runs): BEGIN and the dedupe step in one round trip, then the writes and COMMIT: two.")
	p("- **%s**: the same statements written directly with pgx, one round trip each (five): what a Go client", scenRawPgx)
	p("  of the limit costs.")
	p("- **%s**: the same statements sent as one pgx batch (BEGIN … COMMIT in one round trip), as txhook sends", scenBatchPgx)
	p("  them for the example, written with pgx alone: what the library's round trip costs a Go client with no library.")
	p("- **%s**: `Process` on events already processed (what a provider's retry storm after an outage costs), by", scenLibraryDup)
	p("  the Processor that processed them: it remembers the last keys it saw done (`Config.RecentKeys`, 10,000)")
	p("  and answers those without a round trip, the others with a read. The redeliveries are drawn from every event")
	p("  the row processed so far, more than it remembers after the first round: later rounds mix both answers.")
	p("- **%s**: the same with `RecentKeys: -1`, every redelivery going to the database, as one that another", scenLibraryDupDB)
	p("  process (or this one before a restart) processed: after the first dozen the Processor reads each key's status")
	p("  before opening a transaction, one round trip.")
	p("- **%s**: the stripe-orders example as a separate process, driven by a Go load generator over HTTP/1.1", scenHTTP)
	p("  keep-alive connections with real Stripe signatures (fresh timestamp and HMAC per request); the example logs one")
	p("  line per delivery (to a file in /dev/shm when the machine has it: in memory, away from the database's disk); its")
	p("  pool has c connections (`pool_max_conns` and `pool_min_conns` in DATABASE_URL).")
	p("- **%s**: the same example as %d processes on the same database, each with a pool of c/%d connections", scenHTTPMulti, httpReceivers, httpReceivers)
	p("  rounded up (together about the c of the other rows: c rounded up to a multiple of %d), behind the same load", httpReceivers)
	p("  generator with the same c clients, sending each request to the next process in turn (round robin, as a load")
	p("  balancer would). Allocations and receiver CPU are the processes' sum.")
	p("- **%s**: the same load generator redelivering events the example already processed.", scenHTTPDup)
	p("- **%s**: a straightforward hand-written receiver (net/http, hand-rolled signature check, one pgx", scenBaselineHTTP)
	p("  transaction: its own event-id insert ON CONFLICT DO NOTHING, then the same writes), as a separate process with")
	p("  a pool of c connections and the same load generator. It logs nothing.")
	r.describeInbox(p)
	p("- **%s**, **%s**: checkout events published to RabbitMQ (persistent, the event id in", scenAMQP, scenAMQPBaseline)
	p("  `message-id`), one quorum queue per row, each client waiting until the consumer, in this process, has applied and")
	p("  acknowledged its event: the latency is publish to ack after COMMIT, c the messages in flight (the prefetch). The")
	p("  txhook row is amqpconsumer with the example's handler and configuration; the hand-written one is the usual consumer")
	p("  on the same client: its own event-id insert ON CONFLICT DO NOTHING and the same writes in one pgx transaction, then")
	p("  the ack. Each consumer has a connection of its own, apart from the publishers'. CPU per event includes the")
	p("  publishers and the broker (the rest of the machine).")
	p("")
	p("Latencies are per event as the client sees them. Allocations per event are heap allocations (Go's runtime")
	p("counters, as `-benchmem` reports them) in the process doing the work: the measuring process for the in-process rows,")
	p("the receiver processes for the HTTP rows (the example is built with a small file added through `go build -overlay`")
	p("that reports its allocation count on SIGUSR1; its own files and request path are unchanged). CPU per event splits")
	p("the machine's busy time over the cell: the load generator (this process, or pgbench), the receiver processes, and the")
	p("rest (PostgreSQL, mostly, and anything else running on the machine).")
	p("")
	p("## Results")
	p("")
	for _, c := range r.opts.conc {
		p("### Concurrency %d", c)
		p("")
		p("| scenario | events/s | ratio to limit | rounds (events/s) | p50 ms | p99 ms | allocs/event | CPU ms/event: client / receiver / rest | PostgreSQL CPU ms/event | WAL bytes/event | errors |")
		p("|---|---:|---:|---|---:|---:|---:|---|---:|---:|---:|")
		for _, x := range r.cells {
			if x.Concurrency != c {
				continue
			}
			ratio := "—"
			if rt := r.ratio(x.Scenario, scenLimit, c); rt > 0 {
				ratio = fmt.Sprintf("%.2f×", rt)
			}
			allocs := "—"
			if x.AllocsPerEvent >= 0 {
				allocs = fmt.Sprintf("%.0f", x.AllocsPerEvent)
			}
			var rounds []string
			for _, v := range x.Rates {
				rounds = append(rounds, fmt.Sprintf("%.0f", v))
			}
			pgCPU, wal := "—", "—"
			if x.DB.HasPG {
				pgCPU = fmt.Sprintf("%.3f", x.DB.CPU)
			}
			if x.DB.HasDB {
				wal = fmt.Sprintf("%.0f", x.DB.WAL)
			}
			p("| %s | %.0f | %s | %s | %s | %s | %s | %.2f / %.2f / %.2f | %s | %s | %d |", x.Scenario, x.rate(), ratio, strings.Join(rounds, ", "),
				ms(x.P50), ms(x.P99), allocs, x.CPU.Client, x.CPU.Receiver, x.CPU.Rest, pgCPU, wal, x.Errors)
		}
		p("")
	}
	p("## Ratios and targets")
	p("")
	p("| ratio | c=%s |", joinConc(r.opts.conc, " | c="))
	p("|---|%s", strings.Repeat("---:|", len(r.opts.conc)))
	rows := []ratioRow{
		{"txhook library / limit", scenLibrary, scenLimit},
		{"txhook library, dedupe step first / limit", scenLibraryFirst, scenLimit},
		{"txhook library / limit, pipelined as txhook", scenLibrary, scenLimitPipe},
		{"limit, pipelined as txhook / limit", scenLimitPipe, scenLimit},
		{"txhook HTTP / limit", scenHTTP, scenLimit},
		{"txhook HTTP, 3 receivers / limit", scenHTTPMulti, scenLimit},
		{"txhook HTTP: 3 receivers / 1 receiver", scenHTTPMulti, scenHTTP},
		{"baseline pgx HTTP / limit", scenBaselineHTTP, scenLimit},
		{"naive dedupe / limit", scenNaive, scenLimit},
		{"pgx, same SQL / limit", scenRawPgx, scenLimit},
		{"txhook library / pgx, same SQL", scenLibrary, scenRawPgx},
		{"pgx batch / limit", scenBatchPgx, scenLimit},
		{"duplicate storm / new events (library)", scenLibraryDup, scenLibrary},
		{"duplicate storm, no memory / new events (library)", scenLibraryDupDB, scenLibrary},
		{"duplicate storm / new events (HTTP)", scenHTTPDup, scenHTTP},
		{"txhook HTTP / baseline pgx HTTP", scenHTTP, scenBaselineHTTP},
		{"txhook AMQP consumer / hand-written AMQP consumer", scenAMQP, scenAMQPBaseline},
	}
	rows = append(rows, inboxRatios...)
	rows = append(rows, natsRatios...)
	for _, row := range rows {
		var vals []string
		for _, c := range r.opts.conc {
			if rt := r.ratio(row.a, row.b, c); rt > 0 {
				vals = append(vals, fmt.Sprintf("%.2f×", rt))
			} else {
				vals = append(vals, "—")
			}
		}
		p("| %s | %s |", row.label, strings.Join(vals, " | "))
	}
	p("")
	p("Targets:")
	p("")
	// target writes the ratio a/b at concurrency c against want, with the
	// ratio of each round.
	target := func(label, a, b string, c int, want float64) {
		got := r.ratio(a, b, c)
		verdict := "met"
		if got < want {
			verdict = "**missed**"
		}
		if got == 0 {
			verdict = "not measured"
		}
		var rounds []string
		for _, x := range r.roundRatios(a, b, c) {
			rounds = append(rounds, fmt.Sprintf("%.2f", x))
		}
		p("- %s: %.2f× (target ≥ %.1f×): %s; rounds %s", label, got, want, verdict, strings.Join(rounds, ", "))
	}
	target("txhook library at concurrency 8 vs the limit", scenLibrary, scenLimit, 8, 0.9)
	for _, c := range r.opts.conc {
		target(fmt.Sprintf("txhook HTTP at concurrency %d vs the limit", c), scenHTTP, scenLimit, c, 0.5)
	}
	for _, c := range r.opts.conc {
		target(fmt.Sprintf("duplicate path at concurrency %d vs new events (library)", c), scenLibraryDup, scenLibrary, c, 2.5)
		target(fmt.Sprintf("duplicate path at concurrency %d vs new events (library, no memory)", c), scenLibraryDupDB, scenLibrary, c, 2.5)
		target(fmt.Sprintf("duplicate path at concurrency %d vs new events (HTTP)", c), scenHTTPDup, scenHTTP, c, 2.5)
	}
	for _, c := range r.opts.conc {
		target(fmt.Sprintf("txhook HTTP at concurrency %d vs the baseline pgx HTTP", c), scenHTTP, scenBaselineHTTP, c, httpBaselineTarget)
		if h, ok1 := r.find(scenHTTP, c); ok1 {
			if bl, ok2 := r.find(scenBaselineHTTP, c); ok2 && h.DB.HasPG && bl.DB.HasPG {
				verdict := "met"
				if h.DB.CPU > bl.DB.CPU {
					verdict = "**missed**"
				}
				p("- PostgreSQL's CPU per event at concurrency %d, txhook HTTP vs the baseline: %.3f vs %.3f ms, %.2f× (target ≤ 1×): %s",
					c, h.DB.CPU, bl.DB.CPU, h.DB.CPU/bl.DB.CPU, verdict)
			}
		}
	}
	for _, c := range r.opts.conc {
		if _, ok := r.find(scenAMQP, c); ok {
			target(fmt.Sprintf("txhook AMQP consumer at concurrency %d vs the hand-written one", c), scenAMQP, scenAMQPBaseline, c, amqpTarget)
		}
	}
	r.inboxTargets(p, target)
	r.explain(p)
	r.explainInbox(p)
	r.describeNATS(p)
	p("")
	p("## Where the time goes")
	p("")
	p("CPU per event (ms), summed over the load generator, the receiver and the rest of the machine:")
	p("")
	p("| scenario | %s |", "c="+joinConc(r.opts.conc, " | c="))
	p("|---|%s", strings.Repeat("---:|", len(r.opts.conc)))
	for _, s := range []string{scenLimit, scenLimitPipe, scenBatchPgx, scenRawPgx, scenLibrary, scenLibraryFirst, scenNaive, scenLibraryDup, scenLibraryDupDB, scenBaselineHTTP, scenHTTP, scenHTTPMulti, scenHTTPDup, scenInboxAccept, scenRiverAccept, scenInboxSync, scenInboxE2E, scenRiverE2E, scenInboxE2ETuned, scenRiverE2ETuned, scenInboxDup, scenRiverDup, scenAMQP, scenAMQPBaseline, scenNATS, scenNATSHand} {
		if _, ok := r.find(s, r.opts.conc[0]); !ok {
			continue // not measured in this run
		}
		var vals []string
		for _, c := range r.opts.conc {
			x, ok := r.find(s, c)
			if !ok {
				vals = append(vals, "—")
				continue
			}
			vals = append(vals, fmt.Sprintf("%.2f", x.CPU.Client+x.CPU.Receiver+x.CPU.Rest))
		}
		p("| %s | %s |", s, strings.Join(vals, " | "))
	}
	p("")
	p("When the CPUs are saturated, events/s is the machine's CPU divided by these figures, so a row's ratio to the")
	p("limit is roughly the limit's CPU per event over the row's.")
	for _, c := range r.opts.conc {
		lim, ok1 := r.find(scenLimit, c)
		raw, ok2 := r.find(scenRawPgx, c)
		lib, ok3 := r.find(scenLibrary, c)
		if !ok1 || !ok2 || !ok3 {
			continue
		}
		p("- c=%d: pgbench spends %.2f ms per event in the client and %.2f in the rest; pgx with the same SQL %.2f and %.2f;",
			c, lim.CPU.Client, lim.CPU.Rest, raw.CPU.Client, raw.CPU.Rest)
		p("  the txhook library %.2f and %.2f. txhook minus plain pgx: %+.2f ms per event (txhook sends four round trips fewer).",
			lib.CPU.Client, lib.CPU.Rest, (lib.CPU.Client+lib.CPU.Rest)-(raw.CPU.Client+raw.CPU.Rest))
	}
	if l8, ok := r.find(scenLimit, 8); ok {
		for _, c := range r.opts.conc {
			lc, ok := r.find(scenLimit, c)
			if !ok || c <= 8 || lc.CPU.Rest < 1.3*l8.CPU.Rest {
				continue
			}
			p("- At c=%d pgbench itself slows down: PostgreSQL spends %.2f ms of CPU per pgbench transaction against %.2f at c=8", c, lc.CPU.Rest, l8.CPU.Rest)
			p("  (with %d backends wanting %d CPUs). The Go clients spend longer between statements and keep fewer backends", c, runtime.NumCPU())
			p("  running at once, so at this concurrency they can pass the limit: read ratios above 1× here that way.")
		}
	}
	r.walByRelation(p)
	r.describeRowCost(p)
	if r.profile.text != "" {
		p("")
		p("CPU profile of the Go process running the txhook library at concurrency %d, in a separate %v run after", r.profConc, profileDuration)
		p("the measurements (`go tool pprof -top`):")
		p("")
		p("```")
		p("%s", strings.TrimSpace(r.profile.text))
		p("```")
	}
	if r.httpProfile.text != "" {
		p("")
		p("CPU profile of the stripe-orders example under the txhook HTTP load (new events) at concurrency %d, in a", r.profConc)
		p("separate %v run (the same overlay file profiles the process on SIGUSR2):", profileDuration)
		p("")
		p("```")
		p("%s", strings.TrimSpace(r.httpProfile.text))
		p("```")
	}
	if r.dupProfile.text != "" {
		p("")
		p("CPU profile of the stripe-orders example under redeliveries of processed events (the duplicate path) at")
		p("concurrency %d, in a separate %v run:", r.profConc, profileDuration)
		p("")
		p("```")
		p("%s", strings.TrimSpace(r.dupProfile.text))
		p("```")
	}
	if r.micro != "" {
		p("")
		p("## Go micro-benchmarks")
		p("")
		where := "against the same server"
		if r.opts.dbURL != "" {
			where = "(databases on TEST_DATABASE_URL, or a throwaway cluster)"
		}
		p("`go test -run '^$' -bench '^Benchmark(Process|Stripe)' -benchmem . ./handler/` %s:", where)
		p("")
		p("```")
		p("%s", strings.TrimSpace(r.micro))
		p("```")
	}
	return b.String()
}

func joinConc(cs []int, sep string) string {
	var s []string
	for _, c := range cs {
		s = append(s, fmt.Sprint(c))
	}
	return strings.Join(s, sep)
}

// explain writes, from the measurements alone, what separates each row
// from the limit at the profiled concurrency.
func (r *report) explain(p func(string, ...any)) {
	c := r.profConc
	if c == 0 {
		c = profileConcurrency
	}
	lib := r.ratio(scenLibrary, scenLimit, c)
	raw := r.ratio(scenRawPgx, scenLimit, c)
	batch := r.ratio(scenBatchPgx, scenLimit, c)
	if lib == 0 || raw == 0 {
		return
	}
	p("")
	p("What separates the rows from the limit at concurrency %d, from the figures above:", c)
	p("")
	p("- Plain pgx sending the same statements one round trip each (five) reaches %.2f× of the limit; the txhook", raw)
	p("  library, configured as the example (one round trip), %.2f× (library / plain pgx: %.2f×); with its default", lib, lib/raw)
	p("  configuration (the dedupe step before the handler: two round trips) %.2f×. Sent as one batch with pgx alone,", r.ratio(scenLibraryFirst, scenLimit, c))
	p("  the same statements reach %.2f×.", batch)
	if pipe := r.ratio(scenLimitPipe, scenLimit, c); pipe > 0 {
		p("  pgbench sending txhook's one round trip reaches %.2f× of the limit: the library runs at %.2f× of a C client", pipe, lib/pipe)
		p("  doing what it does.")
	}
	if r.profile.text != "" {
		p("  In the library's CPU profile, %.1f%% of the samples are in txhook's own functions, %.1f%% have pgx on the", r.profile.own, r.profile.areas[profileAreas[0].label])
		p("  stack (building, sending and reading the statements) and %.1f%% are in system calls: what separates the", r.profile.areas[profileAreas[5].label])
		p("  library from pgbench is the Go client's cost per round trip (a write and a read system call and a goroutine")
		p("  wake-up per statement, on a machine whose CPUs the client shares with PostgreSQL), not txhook's code.")
	}
	hp := r.ratio(scenHTTP, scenLimit, c)
	base := r.ratio(scenBaselineHTTP, scenLimit, c)
	if hp > 0 && base > 0 {
		h, _ := r.find(scenHTTP, c)
		b, _ := r.find(scenBaselineHTTP, c)
		p("- Over HTTP, txhook reaches %.2f× of the limit and the hand-written pgx receiver %.2f× (txhook / baseline:", hp, base)
		p("  %.2f×). The example's process spends %.2f ms of CPU per event, the baseline's %.2f; the load generator %.2f",
			hp/base, h.CPU.Receiver, b.CPU.Receiver, h.CPU.Client)
		p("  and %.2f.", b.CPU.Client)
		if r.httpProfile.text != "" {
			a := r.httpProfile.areas
			p("  In the example's CPU profile: net/http %.1f%%, pgx %.1f%%, log/slog %.1f%%, encoding/json %.1f%%, crypto %.1f%%,",
				a[profileAreas[1].label], a[profileAreas[0].label], a[profileAreas[3].label], a[profileAreas[2].label], a[profileAreas[4].label])
			p("  txhook's own functions %.1f%%.", r.httpProfile.own)
		}
	}
	if m := r.ratio(scenHTTPMulti, scenHTTP, c); m > 0 {
		one, _ := r.find(scenHTTP, c)
		many, _ := r.find(scenHTTPMulti, c)
		p("- %d example processes on the same database, behind the round-robin load generator, reach %.2f× the rate of", httpReceivers, m)
		p("  one process with the same number of clients; the processes spend %.2f ms of CPU per event together, the one", many.CPU.Receiver)
		p("  process %.2f, and p99 is %s ms against %s. Here all of them share the machine's %d CPUs with PostgreSQL and",
			one.CPU.Receiver, ms(many.P99), ms(one.P99), runtime.NumCPU())
		p("  the load generator, so more processes bring no more CPU: the row shows what running the receiver as %d", httpReceivers)
		p("  processes on one database costs against one, not what %d machines would reach.", httpReceivers)
	}
	if d := r.ratio(scenHTTPDup, scenHTTP, c); d > 0 {
		p("- A redelivery of a key the example's Processor saw done recently is answered from its memory: over HTTP it")
		p("  costs the HTTP exchange, the signature check and the log line, no round trip; the storm runs at %.2f× the", d)
		p("  new-event rate (library: %.2f×). Without the memory (another process's keys, or after a restart) a", r.ratio(scenLibraryDup, scenLibrary, c))
		p("  duplicate in a storm costs one read outside any transaction (library: %.2f× the new-event rate), and a", r.ratio(scenLibraryDupDB, scenLibrary, c))
		p("  duplicate among new events three round trips (BEGIN, the dedupe step, whose failure makes the server skip")
		p("  the handler's writes and COMMIT sent with it; ROLLBACK; the read of a lease-mode claim holding the key).")
		if r.dupProfile.text != "" {
			a := r.dupProfile.areas
			p("  In the example's CPU profile on that path: net/http %.1f%%, pgx %.1f%%, log/slog %.1f%%, encoding/json %.1f%%,",
				a[profileAreas[1].label], a[profileAreas[0].label], a[profileAreas[3].label], a[profileAreas[2].label])
			p("  crypto %.1f%%, txhook's own functions %.1f%%.", a[profileAreas[4].label], r.dupProfile.own)
		}
	}
}
