// Command demo tells txhook's story with real processes, real signatures and
// a real PostgreSQL: run it with `make demo` (or `go run ./cmd/demo`) from
// the repository.
//
// It starts the stripe-orders example as a child process and, acting as
// Stripe, shows four things: an event delivered and processed; the same
// event redelivered and answered as a duplicate with no second effect; a
// delivery during which the server crashes (a real process exit at a txhook
// crash point), after which Stripe's retry is processed exactly once; and,
// side by side, the naive dedupe (the event id committed first, then the
// work) losing an event to the same crash; then, with the github-pushes
// example in inbox mode, GitHub (which never retries) sending a push whose
// handler fails on its first try and a push whose process dies mid-job, each
// applied exactly once. It ends with the database's final state and exits
// with status 1 if any step did not behave as described.
//
// With DATABASE_URL unset it starts a throwaway PostgreSQL cluster from the
// machine's initdb and pg_ctl and removes it at the end. With DATABASE_URL
// set it uses that database: the example creates its tables there, and the
// demo's rows carry a random tag so that runs do not collide.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook/internal/childproc"
	"github.com/txhook/txhook/internal/pgcluster"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, os.Getenv("DATABASE_URL")); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// errMisbehaved is returned when the demo ran to the end but some step did
// not behave as described.
var errMisbehaved = errors.New("some steps did not behave as described (see FAIL above)")

// run tells the story on the database at dbURL, or on a throwaway cluster
// when dbURL is empty, writing to out.
func run(ctx context.Context, out io.Writer, dbURL string) (err error) {
	fmt.Fprintln(out, "txhook demo: a Stripe webhook applied exactly once, even when the server crashes")
	fmt.Fprintln(out)
	fmt.Fprintln(out, "Setup")
	if dbURL == "" {
		fmt.Fprintln(out, "  No DATABASE_URL set: starting a throwaway PostgreSQL (initdb and pg_ctl in a temporary folder).")
		c, err := pgcluster.Start(ctx)
		if err != nil {
			return fmt.Errorf("start a throwaway PostgreSQL (or set DATABASE_URL to use a running server): %w", err)
		}
		defer func() {
			if serr := c.Stop(); serr != nil && err == nil {
				err = fmt.Errorf("stop the throwaway PostgreSQL: %w", serr)
				return
			}
			fmt.Fprintln(out, "Stopped the throwaway PostgreSQL and removed its folder.")
		}()
		fmt.Fprintf(out, "  PostgreSQL is running on 127.0.0.1:%d.\n", c.Port)
		dbURL = c.URL
	} else {
		fmt.Fprintln(out, "  Using the database at DATABASE_URL.")
	}

	dir, err := os.MkdirTemp("", "txhook-demo-")
	if err != nil {
		return fmt.Errorf("create temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	fmt.Fprintln(out, "  Building the stripe-orders example and, for comparison, a naive receiver (go build).")
	bins, err := childproc.BuildModule(ctx, dir, stripeOrdersDir, stripeOrdersPkg, naiveReceiverPkg)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "  Building the github-pushes example (inbox mode, on River).")
	githubBins, err := childproc.BuildModule(ctx, dir, githubPushesDir, githubPushesPkg)
	if err != nil {
		return err
	}
	githubBin := githubBins[githubPushesPkg]

	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("open database: %w", err)
	}
	defer pool.Close()

	d := &demo{
		out:       out,
		dbURL:     dbURL,
		bins:      bins,
		githubBin: githubBin,
		secret:    "whsec_demo_" + randomTag(8),
		state:     state{pool: pool},
		tag:       randomTag(2),
	}
	d.send = newSender(d.secret)
	defer d.stopServers()
	if err := d.story(ctx); err != nil {
		return err
	}
	if len(d.failures) > 0 {
		fmt.Fprintln(out)
		fmt.Fprintln(out, "The demo did NOT behave as described:")
		for _, f := range d.failures {
			fmt.Fprintln(out, "  -", f)
		}
		return errMisbehaved
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, "Every step behaved as described.")
	return nil
}

// randomTag returns 2n random hex digits.
func randomTag(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}
