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
	fs := c.newFlags("prune", "prune [--older-than DURATION] [--batch N] [--include-failed] [--dry-run]")
	olderThan := fs.String("older-than", "14d", "delete events completed longer ago than this: 14d, 36h, 1d12h")
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
	if *batch < 1 || *batch > 1_000_000 {
		return usagef("--batch must be between 1 and 1000000")
	}
	if age < minSafeRetention {
		fmt.Fprintf(c.stderr, "txhook prune: warning: a retention of %v is shorter than the providers' retry and redelivery windows (3 days for Stripe and GitHub); a pruned event that is delivered again is processed again\n", age)
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
	var p *progress
	if term, ok := c.stdout.(*os.File); ok && isTerminal(term) {
		p = &progress{w: term, start: start}
		count := opts
		count.DryRun = true
		if res, err := txhook.Prune(ctx, conn, count); err == nil {
			p.total = res.Deleted
		}
		opts.Progress = p.update
	}
	res, err := txhook.Prune(ctx, conn, opts)
	elapsed := time.Since(start)
	if p != nil {
		p.finish()
	}
	if err != nil {
		return fmt.Errorf("stopped after deleting %d %s: %w", res.Deleted, what, err)
	}
	if res.Locked {
		fmt.Fprintf(c.stderr, "txhook prune: another pruner holds the pruning lock and is deleting; stopped after %d rows\n", res.Deleted)
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

// progress rewrites one line on a terminal, at most a few times a second.
type progress struct {
	w       io.Writer
	start   time.Time
	total   int64
	last    time.Time
	printed bool
}

func (p *progress) update(deleted int64) {
	now := time.Now()
	if now.Sub(p.last) < 200*time.Millisecond {
		return
	}
	p.last = now
	p.printed = true
	line := fmt.Sprintf("deleted %d rows", deleted)
	if p.total > 0 {
		line = fmt.Sprintf("deleted %d of about %d rows (%.0f%%)", deleted, p.total, 100*float64(deleted)/float64(p.total))
	}
	fmt.Fprintf(p.w, "\r\033[K%s, %.0f rows/s", line, rate(deleted, now.Sub(p.start)))
}

func (p *progress) finish() {
	if p.printed {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
