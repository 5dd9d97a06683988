package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/txhook/txhook"
)

// minSafeRetention is the shortest retention that outlasts the automatic
// retries and manual redeliveries of the common providers (Stripe and GitHub:
// 3 days). Shorter ones get a warning.
const minSafeRetention = 3 * 24 * time.Hour

func runPrune(ctx context.Context, c *cli, args []string) error {
	fs := c.newFlags("prune", "prune [--older-than DURATION] [--body-dedupe-window DURATION] [--batch N] [--include-failed] [--dry-run]")
	olderThan := fs.String("older-than", "14d", "delete events completed longer ago than this: 14d, 36h, 1d12h")
	bodyDedupeWindow := fs.String("body-dedupe-window", "14d", "the longest body dedupe window of the guarded endpoints (GitHub, Shopify); 0 if none")
	batch := fs.Int("batch", txhook.DefaultPruneBatchSize, "rows deleted per transaction")
	includeFailed := fs.Bool("include-failed", false, "delete failed events (dead letters) too")
	dryRun := fs.Bool("dry-run", false, "count the events that would be deleted; delete nothing")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	age, err := parseAge(*olderThan)
	if err != nil {
		return usagef("--older-than: %v", err)
	}
	if age == 0 {
		return usagef("--older-than must be more than 0")
	}
	window, err := parseAge(*bodyDedupeWindow)
	if err != nil {
		return usagef("--body-dedupe-window: %v", err)
	}
	if *batch < 1 || *batch > 1_000_000 {
		return usagef("--batch must be between 1 and 1000000")
	}
	if age < minSafeRetention {
		fmt.Fprintf(c.stderr, "%s prune: warning: a retention of %v is shorter than the providers' retry and redelivery windows (3 days for Stripe and GitHub); a pruned event that is delivered again is processed again\n", c.name, age)
	}
	if age < window {
		fmt.Fprintf(c.stderr, "txhook prune: warning: a retention of %v is shorter than the body dedupe window of %v: the body dedupe of GitHub and Shopify endpoints forgets a body once its row is pruned; pass --body-dedupe-window with the longest window of your guarded endpoints (0 if none)\n", age, window)
	}
	conn, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer closeConn(conn)
	opts := txhook.PruneOptions{OlderThan: age, BatchSize: *batch, IncludeFailed: *includeFailed}

	what := "done events"
	if *includeFailed {
		what = "done and failed events"
	}
	if *dryRun {
		opts.DryRun = true
		res, err := txhook.Prune(ctx, conn, opts)
		if err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "would delete %d %s completed before %s\n", res.Deleted, what, formatTime(res.Cutoff))
		return nil
	}

	start := time.Now()
	p := c.newProgress("prune", "deleted", "rows")
	if p.tty {
		count := opts
		count.DryRun = true
		if res, err := txhook.Prune(ctx, conn, count); err == nil {
			p.total = res.Deleted
		}
	}
	opts.Progress = p.update
	res, err := txhook.Prune(ctx, conn, opts)
	elapsed := time.Since(start)
	p.finish()
	if err != nil {
		return fmt.Errorf("stopped after deleting %d %s: %w", res.Deleted, what, err)
	}
	if res.Locked {
		fmt.Fprintf(c.stderr, "%s prune: another pruner holds the pruning lock and is deleting; stopped after %d rows\n", c.name, res.Deleted)
	}
	if res.Cutoff.IsZero() {
		// The lock was held before this run read its cutoff.
		fmt.Fprintf(c.stdout, "deleted 0 %s\n", what)
		return nil
	}
	fmt.Fprintf(c.stdout, "deleted %d %s completed before %s in %d batches (%s, %.0f rows/s)\n",
		res.Deleted, what, formatTime(res.Cutoff), res.Batches, elapsed.Round(time.Millisecond), rate(res.Deleted, elapsed))
	return nil
}

func rate(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// isTerminal reports whether f is a character device (a terminal), where a
// progress line that rewrites itself makes sense.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// progress reports a long command's progress on stderr: on a terminal, one
// line that rewrites itself a few times a second; otherwise a line every
// progressEvery, for logs.
type progress struct {
	w           io.Writer
	prefix      string
	verb, noun  string
	tty         bool
	every       time.Duration
	start, last time.Time
	total       int64
	printed     bool
}

func (c *cli) newProgress(command, verb, noun string) *progress {
	f, ok := c.stderr.(*os.File)
	p := &progress{w: c.stderr, prefix: c.name + " " + command + ": ", verb: verb, noun: noun,
		tty: ok && isTerminal(f), every: c.progressEvery, start: time.Now()}
	if p.tty {
		p.every = 200 * time.Millisecond
	}
	p.last = p.start
	return p
}

func (p *progress) update(done int64) {
	now := time.Now()
	if now.Sub(p.last) < p.every {
		return
	}
	p.last = now
	line := fmt.Sprintf("%s %d %s so far", p.verb, done, p.noun)
	if p.total > 0 {
		line = fmt.Sprintf("%s %d of about %d %s (%.0f%%)", p.verb, done, p.total, p.noun, 100*float64(done)/float64(p.total))
	}
	line = fmt.Sprintf("%s, %.0f %s/s", line, rate(done, now.Sub(p.start)), p.noun)
	if p.tty {
		p.printed = true
		fmt.Fprintf(p.w, "\r\033[K%s", line)
		return
	}
	fmt.Fprintf(p.w, "%s%s\n", p.prefix, line)
}

// finish clears a terminal's progress line.
func (p *progress) finish() {
	if p.printed {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
