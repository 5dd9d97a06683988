// Command bench measures txhook against the database's own limit, side by
// side, on one PostgreSQL in one run, and writes the results to
// BENCHMARKS.md.
//
// At each concurrency (1, 8 and 32 by default) it measures:
//
//   - limit: pgbench running the SQL one processed event costs (the dedupe
//     step and the example's business writes, in one transaction);
//   - naive: the naive dedupe (key committed alone, then the work);
//   - txhook library: Processor.Process called directly;
//   - duplicate storm (library): Process on already processed events;
//   - txhook HTTP: the stripe-orders example under load through real HTTP
//     with real Stripe signatures;
//   - txhook HTTP, 3 receivers: the same example as three processes on the
//     same database, the load generator sending requests round robin;
//   - duplicate storm (HTTP): redeliveries of already processed events;
//   - baseline HTTP: a hand-written pgx receiver doing the same work;
//   - inbox mode: its accept rate over HTTP beside the synchronous route on
//     the same endpoint and beside a River inbox receiver written by hand,
//     end to end on the defaults of each and tuned alike, and redeliveries;
//   - txhook AMQP consumer: amqpconsumer applying checkout events published
//     to RabbitMQ, publish to ack, beside a hand-written consumer on the same
//     client and broker;
//   - NATS JetStream: natsconsumer beside a hand-written consumer, each
//     message published and awaited until acknowledged after its COMMIT;
//   - for every row, the WAL and PostgreSQL's CPU per event.
//
// With DATABASE_URL unset it starts a throwaway PostgreSQL with the default
// durability settings (fsync, synchronous_commit and full_page_writes on).
// Run it with `make bench`, or from the tests module: go run ./bench -h.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/txhook/txhook/internal/rabbitnode"
)

func main() {
	if os.Getenv(baselineEnv) != "" {
		os.Exit(baselineMain())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var o options
	flag.StringVar(&o.out, "out", "BENCHMARKS.md", "file to write the report to")
	flag.StringVar(&o.root, "root", "..", "the txhook repository (for go test -bench and go build)")
	conc := flag.String("c", "1,8,32", "comma-separated concurrency levels")
	flag.DurationVar(&o.duration, "d", 3*time.Second, "measured time per round of a cell")
	flag.IntVar(&o.rounds, "rounds", 5, "rounds per cell (the scenarios interleaved; the median rate is reported)")
	flag.DurationVar(&o.warmup, "warmup", 500*time.Millisecond, "unmeasured warm-up per round of a cell")
	flag.BoolVar(&o.micro, "micro", true, "also run the Go micro-benchmarks")
	flag.BoolVar(&o.profile, "profile", true, "also profile the library and the example (pprof)")
	flag.BoolVar(&o.rowCost, "rowcost", true, "also measure what the events row costs the server, part by part (CHECK constraints, indexes, the lock wait bound)")
	flag.BoolVar(&o.inbox, "inbox", true, "also measure inbox mode (accept, end to end) and River's own rate")
	flag.BoolVar(&o.amqp, "amqp", true, "also measure the RabbitMQ consumer beside a hand-written one (the machine's broker, or a node of the run's own)")
	flag.BoolVar(&o.onlyInbox, "only-inbox", false, "measure only the inbox rows (a quick check; no ratios to the limit)")
	only := flag.String("only", "", "measure only the rows whose names match this regular expression (a quick check of a few rows)")
	flag.BoolVar(&o.nats, "nats", true, "also measure the NATS JetStream consumer beside a hand-written one (needs nats-server)")
	flag.BoolVar(&o.onlyNATS, "only-nats", false, "measure only the NATS rows (a quick check; no ratios to the limit)")
	flag.BoolVar(&o.scale, "scale", false, "run the scale benchmark instead (make bench-scale): the library row against events tables of -rows rows; writes its section of -out")
	rowsFlag := flag.String("rows", "0,10000000,50000000", "with -scale: comma-separated sizes of the events tables, smallest first")
	flag.StringVar(&o.scaleDir, "scale-dir", defaultScaleDir(), "with -scale and no DATABASE_URL: the folder of the PostgreSQL cluster kept between runs")
	pgSettings := flag.String("pg-settings", strings.Join(scaleSettings(), ","), "with -scale and no DATABASE_URL: comma-separated server settings (name=value) for the kept cluster; none for PostgreSQL's defaults")
	flag.Parse()
	if *only != "" {
		re, err := regexp.Compile(*only)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: bad -only: %v\n", err)
			os.Exit(2)
		}
		o.only = re
	}
	// Each -only-X measures its rows alone: the other optional rows, and
	// the brokers or servers they need, are left out.
	if o.onlyInbox {
		o.amqp, o.nats = false, false
	}
	if o.onlyNATS {
		o.amqp, o.inbox = false, false
	}
	if *pgSettings != "" && *pgSettings != "none" {
		o.scaleSettings = strings.Split(*pgSettings, ",")
	}
	if o.scale {
		// The scale benchmark's own defaults: the library row at
		// concurrency 8, in longer cells.
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		for name, v := range map[string]string{"c": "8", "d": "8s", "warmup": "2s"} {
			if !set[name] {
				_ = flag.Set(name, v)
			}
		}
		for s := range strings.SplitSeq(*rowsFlag, ",") {
			n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
			if err != nil || n < 0 {
				fmt.Fprintf(os.Stderr, "bench: bad size %q\n", s)
				os.Exit(2)
			}
			o.scaleRows = append(o.scaleRows, n)
		}
	}
	for s := range strings.SplitSeq(*conc, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "bench: bad concurrency %q\n", s)
			os.Exit(2)
		}
		o.conc = append(o.conc, n)
	}
	if o.rounds < 1 || o.duration < time.Second {
		fmt.Fprintln(os.Stderr, "bench: -rounds must be at least 1 and -d at least 1s")
		os.Exit(2)
	}
	o.dbURL = os.Getenv("DATABASE_URL")
	runner := run
	if o.scale {
		runner = runScale
	}
	if err := runner(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// options configure a run.
type options struct {
	out      string
	root     string
	conc     []int
	duration time.Duration
	rounds   int
	warmup   time.Duration
	micro    bool
	profile  bool
	rowCost  bool
	// inbox adds the inbox rows; onlyInbox measures nothing else.
	inbox, onlyInbox bool
	// amqp adds the RabbitMQ rows, on amqpNode.
	amqp     bool
	amqpNode *rabbitnode.Node
	// only, when set, keeps the rows whose names it matches.
	only *regexp.Regexp
	// nats adds the NATS rows; onlyNATS measures nothing else.
	nats, onlyNATS bool
	// scale runs the scale benchmark on tables of scaleRows rows, in a
	// cluster kept in scaleDir (without DATABASE_URL).
	scale         bool
	scaleRows     []int64
	scaleDir      string
	scaleSettings []string
	dbURL         string
	tmp           string // the run's temporary folder
	tag           string // prefix of the run's event keys
	// serverURL is the throwaway cluster's maintenance database, where the
	// micro-benchmarks create their databases; empty with DATABASE_URL.
	serverURL string
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s bench: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// defaultScaleDir is where make bench-scale keeps its cluster:
// $TXHOOK_SCALE_DIR, or txhook-bench-scale under /var/tmp (kept across
// reboots, and reachable by the postgres user when the bench runs as root).
func defaultScaleDir() string {
	if d := os.Getenv("TXHOOK_SCALE_DIR"); d != "" {
		return d
	}
	return filepath.Join("/var/tmp", "txhook-bench-scale")
}
