// Package cli is txhook's command line, as a library: the txhook command
// (cmd/txhook) is this package's Main, and an application runs the same
// commands from its own binary, where replay can reach the application's
// handlers.
//
// An application exposes them as a subcommand, for example
// "stripe-orders txhook replay stripe evt_123":
//
//	func main() {
//		if len(os.Args) > 1 && os.Args[1] == "txhook" {
//			cli.Main(os.Args[2:], &cli.Config{
//				Name: "stripe-orders txhook",
//				NewProcessor: func(ctx context.Context, pool *pgxpool.Pool) (*txhook.Processor, error) {
//					return txhook.NewProcessor(pool, &txhook.Config{Routes: routes}) // the application's handlers
//				},
//			})
//		}
//		// ... the application itself
//	}
//
// # Commands
//
//	migrate up | down [N] | down --all [--yes] | version
//	events list [--source S] [--status S] [--type T] [--since AGE|TIME] [--limit N] [--json]
//	events show [--json] SOURCE KEY
//	dead-letters [--source S] [--type T] [--limit N] [--json]
//	replay SOURCE KEY | replay --all [--source S] [--type T] [--limit N] [--dry-run]
//	stats [--json]
//	prune [--older-than DURATION] [--batch N] [--include-failed] [--dry-run]
//
// The database comes from --database-url or, when that is not given, from
// the DATABASE_URL environment variable. Every command takes --help, which
// prints its usage on standard output. Results go to standard output;
// errors go to standard error, one line per mistake. The exit status is 0 on
// success, 1 when the command failed and 2 for a mistake in the command line.
package cli

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
)

// Config configures the commands for an application's binary. The zero
// value (or nil) is the txhook command: every command but replay, which
// needs the application's handlers (replay --dry-run works without them).
type Config struct {
	// Name is the command's name in usage and error messages, such as
	// "myapp txhook". Defaults to "txhook".
	Name string
	// NewProcessor returns the application's Processor, with its routes
	// (txhook.Config.Routes), on a pool connected to the command's
	// database: replay runs failed events through them
	// (txhook.Processor.Replay). Defaults to nil: replay only lists what it
	// would replay (--dry-run).
	NewProcessor func(ctx context.Context, pool *pgxpool.Pool) (*txhook.Processor, error)
}

// Main runs the commands in args (os.Args[1:] for the txhook command, the
// arguments after its own subcommand's name for an application) and exits
// the process with their status. SIGINT and SIGTERM cancel the running
// command.
func Main(args []string, cfg *Config) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := Run(ctx, args, cfg)
	stop()
	os.Exit(code)
}

// Run runs the commands in args with the process's standard input and
// output, and returns the exit status: 0 on success, 1 when the command
// failed, 2 for a mistake in the command line.
func Run(ctx context.Context, args []string, cfg *Config) int {
	return run(ctx, args, env{
		stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr,
		interactive: isTerminal(os.Stdin), progressEvery: 5 * time.Second,
	}, cfg)
}

// Exit statuses.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// usageError is a mistake in the command line: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// env is what one invocation reads and writes.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	// interactive reports that stdin is a terminal, where a question can be
	// asked.
	interactive bool
	// progressEvery is how often a long prune or replay reports its
	// progress on stderr when stderr is not a terminal; 0 reports every
	// step.
	progressEvery time.Duration
}

// cli is one invocation's state.
type cli struct {
	env
	name        string
	cfg         Config
	databaseURL string
}

type command struct {
	name    string
	summary string
	run     func(ctx context.Context, c *cli, args []string) error
}

func commands() []command {
	return []command{
		{"migrate", "apply, roll back or report the schema migrations", runMigrate},
		{"events", "list events or show one", runEvents},
		{"dead-letters", "list failed events waiting for a replay", runDeadLetters},
		{"replay", "replay failed events through the application's handlers", runReplay},
		{"stats", "count events by source and status", runStats},
		{"prune", "delete finished events older than the retention", runPrune},
		{"github", "redeliver failed GitHub webhook deliveries not yet settled", runGitHub},
	}
}

const mainUsage = `Usage: %[1]s [--database-url URL] COMMAND [flags] [args]

%[1]s operates the events table of txhook, the exactly-once webhook library.

Commands:
%[2]s
Flags:
  --database-url URL   PostgreSQL URL (default: $DATABASE_URL)

Run "%[1]s COMMAND --help" for a command's flags.
`

// run runs the command line args and returns the exit status.
func run(ctx context.Context, args []string, e env, cfg *Config) int {
	c := &cli{env: e, name: "txhook"}
	if cfg != nil {
		c.cfg = *cfg
		if cfg.Name != "" {
			c.name = cfg.Name
		}
	}
	usage := func(w io.Writer) {
		var b strings.Builder
		for _, cmd := range commands() {
			fmt.Fprintf(&b, "  %-13s %s\n", cmd.name, cmd.summary)
		}
		fmt.Fprintf(w, mainUsage, c.name, b.String())
	}
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.StringVar(&c.databaseURL, "database-url", "", "PostgreSQL URL (default: $DATABASE_URL)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(c.stdout)
			return exitOK
		}
		fmt.Fprintf(c.stderr, "%s: %v (see %s --help)\n", c.name, err, c.name)
		return exitUsage
	}
	if fs.NArg() == 0 {
		usage(c.stderr)
		return exitUsage
	}
	name, rest := fs.Arg(0), fs.Args()[1:]
	if name == "help" {
		if len(rest) == 0 {
			usage(c.stdout)
			return exitOK
		}
		name, rest = rest[0], []string{"--help"}
	}
	for _, cmd := range commands() {
		if cmd.name == name {
			return c.exit(cmd.name, cmd.run(ctx, c, rest))
		}
	}
	fmt.Fprintf(c.stderr, "%s: unknown command %q (see %s --help)\n", c.name, name, c.name)
	return exitUsage
}

// exit reports err on one line and turns it into an exit status.
func (c *cli) exit(name string, err error) int {
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(c.stderr, "%s %s: %v (see %s %s --help)\n", c.name, name, err, c.name, name)
		return exitUsage
	}
	if pe, ok := errors.AsType[*pgconn.PgError](err); ok && pe.Code == pgerrcode.UndefinedTable {
		fmt.Fprintf(c.stderr, "%s %s: %v: txhook's tables do not exist in this database: run %s migrate up\n", c.name, name, err, c.name)
		return exitFailure
	}
	fmt.Fprintf(c.stderr, "%s %s: %v\n", c.name, name, err)
	return exitFailure
}

// newFlags returns a flag set for a command. It accepts --database-url too,
// so that the flag can follow the command. Its errors and usage are printed
// by parse, never by the flag package.
func (c *cli) newFlags(name, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet(c.name+" "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	// A Func flag has no default to print: the URL given before the
	// command, which may hold a password, stays out of --help.
	fs.Func("database-url", "PostgreSQL `URL` (default: $DATABASE_URL)", func(s string) error {
		c.databaseURL = s
		return nil
	})
	fs.Usage = func() {
		fmt.Fprintf(c.stdout, "Usage: %s %s\n\nFlags:\n", c.name, usage)
		fs.SetOutput(c.stdout)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	return fs
}

// parse parses args with fs, allowing flags after positional arguments, and
// returns the positional arguments. A flag error is a usage error; --help
// prints the usage on stdout and is returned as flag.ErrHelp.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	// The flag package prints the usage on every error: only --help should.
	help := fs.Usage
	fs.Usage = func() {}
	defer func() { fs.Usage = help }()
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				help()
				return nil, err
			}
			return nil, &usageError{msg: err.Error()}
		}
		rest := fs.Args()
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			// The flag package stopped at "--": the rest is positional.
			return append(pos, rest...), nil
		}
		args = rest
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// url returns the database URL from the flag or the environment.
func (c *cli) url() (string, error) {
	if c.databaseURL != "" {
		return c.databaseURL, nil
	}
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u, nil
	}
	return "", usagef("no database: set --database-url or DATABASE_URL")
}

// connect opens one connection to the database.
func (c *cli) connect(ctx context.Context) (*pgx.Conn, error) {
	u, err := c.url()
	if err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	return conn, nil
}

// connectPool opens a small pool (two connections) to the database, for the
// commands that run transactions through txhook (replay, the sweeper).
func (c *cli) connectPool(ctx context.Context) (*pgxpool.Pool, error) {
	u, err := c.url()
	if err != nil {
		return nil, err
	}
	pcfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	pcfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	return pool, nil
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// confirm asks question on stderr and reports whether the answer read from
// stdin is "yes". Without a terminal on stdin it asks nothing and returns
// a usage error naming the flag that confirms instead.
func (c *cli) confirm(question, flagName string) error {
	if !c.interactive {
		return usagef("%s; stdin is not a terminal to ask on: add %s to confirm", question, flagName)
	}
	fmt.Fprintf(c.stderr, "%s\nType yes to go on: ", question)
	line, err := bufio.NewReader(c.stdin).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read the answer: %w", err)
	}
	if strings.TrimSpace(line) != "yes" {
		return errors.New("not confirmed: nothing changed")
	}
	return nil
}
