// Command chaos acts as a provider that will not give up against a server
// that keeps dying, and checks that every event was applied exactly once.
//
// It builds the stripe-orders example and runs it as a child process on
// 127.0.0.1. Acting as Stripe, it sends signed events (checkouts that add to
// a customer's running total, invoices, and, in lease mode, payment intents
// that call a local fulfillment service) from several concurrent senders,
// with injected duplicate deliveries, some of them concurrent. Every delivery
// is retried with backoff until it is answered 2xx; a timeout or a dropped
// connection is a failure and is retried. Meanwhile the example is killed
// with SIGKILL at random moments and restarted, sometimes with
// TXHOOK_CRASH_POINT armed, and PostgreSQL is restarted in immediate mode
// once when the run owns it.
//
// With -receivers N (default 1) it runs N processes of the example on the
// same database, each on its own port, and stands in for Stripe behind a
// round-robin load balancer: each delivery attempt goes to the next process
// in turn, a retry never to the one that failed the attempt before it, so
// duplicates, retries and concurrent copies of an event meet in different
// processes. Each kill (and so each restart, armed or not) hits a process
// drawn at random; the summary line gives the kills per receiver.
//
// At the end it checks the database against what was sent (orders, customer
// totals, invoices, shipments and fulfillment calls per idempotency key,
// every acknowledged event's key committed) and prints one summary line. It
// exits with status 1 when an event was lost or applied twice.
//
// With DATABASE_URL unset it starts a throwaway PostgreSQL cluster (initdb
// and pg_ctl in a temporary folder) and removes it at the end; one it
// restarts runs with PostgreSQL's durable settings (fsync, synchronous_commit
// and full_page_writes on), since an immediate-mode restart of a cluster
// without them loses commits it acknowledged. With DATABASE_URL set it uses
// that database, and never restarts it: the example creates its tables
// there, and the run's rows carry a random tag, so runs do not collide.
//
// With -github it runs the scenario of a sender that never retries
// instead: a fake GitHub delivers each of -events pushes once to the
// github-pushes example (killed and restarted, PostgreSQL restarted once),
// whose redelivery sweeper must then recover every delivery that failed;
// it checks that every push was applied exactly once and reports the
// redeliveries.
//
// With -inbox the same sender meets the example in inbox mode without its
// sweeper: each of -events pushes (default 2,000) is sent once, a few
// answered 2xx are redelivered, the example is SIGKILLed -kills times
// (default 24) while pushes arrive and its queue drains, and PostgreSQL
// restarts once; every push answered 2xx must be applied exactly once by
// the example's own River workers. It reports how many pushes were not
// answered 2xx: those a person or the sweeper must resend.
//
// With -amqp the example consumes the RabbitMQ queue orders instead
// (AMQP_URL), on a broker node the run starts for itself: a publisher
// publishes each of -events events (default 5,000) with its id, with
// confirms, and some twice (a publisher's retry); the example is SIGKILLed
// -kills times (default 24), sometimes restarted with a crash point armed,
// the broker restarted once and PostgreSQL once. Every event must be
// applied exactly once, and no message left in the queues.
//
// With -nats the example consumes the JetStream stream ORDERS of a
// nats-server of the run's own instead: -events Stripe events (default
// 5,000) are published with their ids in Nats-Msg-Id, some again with the
// same id (a publisher's retries, within and after the stream's duplicate
// window), while the example is SIGKILLed -kills times (default 24, some
// restarts with a crash point armed), nats-server is killed and restarted
// once and PostgreSQL (durable) once; every event must be applied exactly
// once and every message acknowledged.
//
// Run it with `make chaos`, or from the tests module: go run ./chaos -h.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/txhook/txhook/internal/pgcluster"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg := defaultConfig()
	flag.IntVar(&cfg.Events, "events", cfg.Events, "events to send")
	flag.IntVar(&cfg.Senders, "senders", cfg.Senders, "concurrent senders")
	flag.IntVar(&cfg.Kills, "kills", cfg.Kills, "SIGKILLs of the example during the run (over all receivers)")
	flag.IntVar(&cfg.Receivers, "receivers", 1, "processes of the example on the database, sent deliveries round robin (Stripe scenario only)")
	flag.Float64Var(&cfg.DupRate, "dup-rate", cfg.DupRate, "share of events redelivered later")
	flag.Float64Var(&cfg.ConcurrentDupRate, "concurrent-dup-rate", cfg.ConcurrentDupRate, "share of events delivered 2-3 times at once")
	flag.Float64Var(&cfg.CrashRate, "crash-rate", cfg.CrashRate, "share of restarts with a TXHOOK_CRASH_POINT armed")
	flag.BoolVar(&cfg.Fulfillment, "lease", cfg.Fulfillment, "send payment intents through lease mode and a local fulfillment service")
	flag.BoolVar(&cfg.Naive, "naive", false, "drive the naive dedupe receiver instead, to see the check catch its losses (exits 1)")
	restartDB := flag.Bool("restart-db", true, "restart PostgreSQL in immediate mode once (only with the throwaway cluster)")
	flag.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "bound on the whole run")
	seed := flag.Uint64("seed", uint64(time.Now().UnixNano()), "random seed")
	quiet := flag.Bool("q", false, "print only the summary line")
	github := flag.Bool("github", false, "run the GitHub scenario: pushes delivered once, failures recovered by the redelivery sweeper")
	inboxMode := flag.Bool("inbox", false, "run the inbox scenario: pushes delivered once, no sweeper; the receiver's River queue applies every push answered 2xx")
	amqpMode := flag.Bool("amqp", false, "run the RabbitMQ scenario: events published with ids to the queue orders, consumed by the example (AMQP_URL); the broker (a node of the run's own) restarted once")
	natsMode := flag.Bool("nats", false, "run the NATS JetStream scenario: events published to the example's stream ORDERS, the consumer SIGKILLed, nats-server and PostgreSQL restarted once")
	flag.Parse()
	cfg.Seed = *seed
	if !*quiet {
		cfg.Log = func(format string, args ...any) {
			fmt.Fprintf(os.Stderr, "%s chaos: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
		}
	}
	if cfg.Receivers < 1 || (cfg.Receivers > 1 && (*github || *inboxMode || *amqpMode || *natsMode)) {
		fmt.Fprintln(os.Stderr, "chaos: -receivers must be at least 1, and above 1 only in the Stripe scenario")
		os.Exit(2)
	}
	scenario := runMain
	if *github {
		scenario = runGitHubMain
	}
	if *inboxMode {
		scenario = runInboxMain
	}
	if *amqpMode {
		scenario = runAMQPMain
	}
	if *natsMode {
		scenario = runNATSMain
	}
	ok, err := scenario(ctx, cfg, os.Getenv("DATABASE_URL"), *restartDB)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

// defaultConfig is a full run sized for a 2-core machine.
func defaultConfig() config {
	return config{
		Events:              5000,
		Senders:             8,
		Kills:               60,
		Customers:           50,
		DupRate:             0.10,
		ConcurrentDupRate:   0.05,
		GuestRate:           0.05,
		InvoiceRate:         0.10,
		LeaseRate:           0.10,
		CrashRate:           0.25,
		CrashPoints:         allCrashPoints,
		Fulfillment:         true,
		FulfillmentFailRate: 0.03,
		Timeout:             10 * time.Minute,
	}
}

// outcome is what every scenario reports.
type outcome interface {
	ok() bool
	summary() string
}

// onDatabase runs scenario on the database at dbURL or, when it is empty,
// on a throwaway cluster (durable, and its restart handed over, when
// restartDB), prints the summary line and any problems, and reports whether
// the run was clean.
func onDatabase(ctx context.Context, log func(string, ...any), dbURL string, restartDB bool,
	scenario func(dbURL string, restart func(context.Context) error) (outcome, []string, error)) (bool, error) {
	var restart func(context.Context) error
	if dbURL == "" {
		if log != nil {
			log("no DATABASE_URL: starting a throwaway PostgreSQL")
		}
		start := pgcluster.Start
		if restartDB {
			start = pgcluster.StartDurable
		}
		c, err := start(ctx)
		if err != nil {
			return false, fmt.Errorf("start a throwaway PostgreSQL (or set DATABASE_URL): %w", err)
		}
		defer c.Stop()
		dbURL = c.URL
		if restartDB {
			restart = c.Restart
		}
	}
	res, problems, err := scenario(dbURL, restart)
	if err != nil {
		return false, err
	}
	for _, p := range problems {
		fmt.Fprintln(os.Stderr, "problem:", p)
	}
	fmt.Println(res.summary())
	return res.ok(), nil
}

// runMain runs cfg (see onDatabase).
func runMain(ctx context.Context, cfg config, dbURL string, restartDB bool) (bool, error) {
	return onDatabase(ctx, cfg.Log, dbURL, restartDB, func(url string, restart func(context.Context) error) (outcome, []string, error) {
		cfg.DatabaseURL, cfg.RestartDB = url, restart
		res, err := run(ctx, cfg)
		return res, res.Problems, err
	})
}

// runGitHubMain runs the GitHub scenario with the sizes of cfg that apply
// (-events pushes, -senders, -kills); see onDatabase.
func runGitHubMain(ctx context.Context, cfg config, dbURL string, restartDB bool) (bool, error) {
	gcfg := defaultGitHubConfig()
	if isFlagSet("events") {
		gcfg.Pushes = cfg.Events
	}
	if isFlagSet("kills") {
		gcfg.Kills = cfg.Kills
	}
	gcfg.Senders, gcfg.Timeout, gcfg.Seed, gcfg.Log = cfg.Senders, cfg.Timeout, cfg.Seed, cfg.Log
	return onDatabase(ctx, cfg.Log, dbURL, restartDB, func(url string, restart func(context.Context) error) (outcome, []string, error) {
		gcfg.DatabaseURL, gcfg.RestartDB = url, restart
		res, err := runGitHub(ctx, gcfg)
		return res, res.Problems, err
	})
}

func isFlagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// runInboxMain runs the inbox scenario with the sizes of cfg that apply
// (-events pushes, -senders, -kills); see onDatabase.
func runInboxMain(ctx context.Context, cfg config, dbURL string, restartDB bool) (bool, error) {
	icfg := defaultInboxConfig()
	if isFlagSet("events") {
		icfg.Pushes = cfg.Events
	}
	if isFlagSet("kills") {
		icfg.Kills = cfg.Kills
	}
	icfg.Senders, icfg.Timeout, icfg.Seed, icfg.Log = cfg.Senders, cfg.Timeout, cfg.Seed, cfg.Log
	return onDatabase(ctx, cfg.Log, dbURL, restartDB, func(url string, restart func(context.Context) error) (outcome, []string, error) {
		icfg.DatabaseURL, icfg.RestartDB = url, restart
		res, err := runInbox(ctx, icfg)
		return res, res.Problems, err
	})
}
