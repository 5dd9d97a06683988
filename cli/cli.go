// Package cli is txhook's command line: migrations, events, stats, pruning.
package cli

import (
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

	"github.com/jackc/pgx/v5"
)

// Main runs the command line in os.Args and exits with its status.
func Main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
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

// cli is one invocation's environment.
type cli struct {
	stdout, stderr io.Writer
	databaseURL    string
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
		{"stats", "count events by source and status", runStats},
		{"prune", "delete finished events older than the retention", runPrune},
	}
}

const mainUsage = `Usage: txhook [--database-url URL] COMMAND [flags] [args]

txhook operates the events table of txhook, the exactly-once webhook library.

Commands:
%s
Flags:
  --database-url URL   PostgreSQL URL (default: $DATABASE_URL)

Run "txhook COMMAND --help" for a command's flags.
`

// run runs the command line args and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := &cli{stdout: stdout, stderr: stderr}
	fs := flag.NewFlagSet("txhook", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.databaseURL, "database-url", "", "PostgreSQL URL (default: $DATABASE_URL)")
	fs.Usage = func() {
		var b strings.Builder
		for _, cmd := range commands() {
			fmt.Fprintf(&b, "  %-8s %s\n", cmd.name, cmd.summary)
		}
		fmt.Fprintf(stderr, mainUsage, b.String())
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return exitUsage
	}
	name, rest := fs.Arg(0), fs.Args()[1:]
	if name == "help" {
		if len(rest) == 0 {
			fs.Usage()
			return exitOK
		}
		name, rest = rest[0], []string{"--help"}
	}
	for _, cmd := range commands() {
		if cmd.name == name {
			return c.exit(cmd.name, cmd.run(ctx, c, rest))
		}
	}
	fmt.Fprintf(stderr, "txhook: unknown command %q\n", name)
	fs.Usage()
	return exitUsage
}

// exit reports err and turns it into an exit status.
func (c *cli) exit(name string, err error) int {
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(c.stderr, "txhook %s: %v\nRun \"txhook %s --help\" for usage.\n", name, err, name)
		return exitUsage
	}
	fmt.Fprintf(c.stderr, "txhook %s: %v\n", name, err)
	return exitFailure
}

// newFlags returns a flag set for a command. It accepts --database-url too,
// so that the flag can follow the command.
func (c *cli) newFlags(name, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet("txhook "+name, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	fs.StringVar(&c.databaseURL, "database-url", c.databaseURL, "PostgreSQL URL (default: $DATABASE_URL)")
	fs.Usage = func() {
		fmt.Fprintf(c.stderr, "Usage: txhook %s\n\nFlags:\n", usage)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses args with fs, allowing flags after positional arguments, and
// returns the positional arguments. A flag error is a usage error, except
// --help, which is returned as flag.ErrHelp.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
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

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}
