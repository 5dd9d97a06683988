package cli

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"

	"github.com/txhook/txhook"
)

func runDeadLetters(ctx context.Context, c *cli, args []string) error {
	fs := c.newFlags("dead-letters", "dead-letters [--source S] [--type T] [--limit N] [--json]")
	var f txhook.EventFilter
	fs.StringVar(&f.Source, "source", "", "only failed events of this source")
	fs.StringVar(&f.Type, "type", "", "only failed events of this type")
	fs.IntVar(&f.Limit, "limit", 100, "show at most N events, oldest first")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	if f.Limit < 1 {
		return usagef("--limit must be at least 1")
	}
	conn, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer closeConn(conn)
	evs, err := txhook.ListDeadLetters(ctx, conn, f)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(c.stdout, evs)
	}
	if len(evs) == 0 {
		fmt.Fprintln(c.stdout, "no dead letters")
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SOURCE\tKEY\tTYPE\tATTEMPTS\tFAILED\tPAYLOAD\tLAST ERROR")
	for _, e := range evs {
		payload := "not stored"
		if e.HasPayload {
			payload = fmt.Sprintf("%d bytes", e.PayloadSize)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", cell(e.Source, 40), cell(e.Key, 60), cell(e.Type, 40),
			e.Attempts, formatTime(e.CompletedAt), payload, cell(e.LastError, 60))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	shown := plural(len(evs), "dead letter") + " shown"
	if c.cfg.NewProcessor != nil {
		fmt.Fprintf(c.stdout, "\n%s, oldest first. Replay one: %s replay SOURCE KEY; all of them: %s replay --all\n", shown, c.name, c.name)
		return nil
	}
	// This binary has no handlers: its replay only lists (--dry-run).
	fmt.Fprintf(c.stdout, "\n%s, oldest first. Replay runs the application's handlers, which %s does not have:\n"+
		"replay from the application's own binary (package cli: \"myapp txhook replay SOURCE KEY\", or --all)\n"+
		"or with the Replay button of its operator console (package admin). %s replay --all --dry-run lists what would run.\n",
		shown, c.name, c.name)
	return nil
}

const replayUsage = `replay [--dry-run] SOURCE KEY
       replay --all [--source S] [--type T] [--limit N] [--dry-run]

Runs failed events (dead letters) again through the application's handlers,
each in its own transaction, exactly once: the handler's writes and the event's
new status commit together. SOURCE KEY may also name a stuck event (events list
--status stuck): an inbox event whose job has ended or is gone, which is taken
over and replayed as a dead letter, or a lease-mode event left in progress with
its lease ended, whose claim is taken over. --dry-run lists what would be
replayed.`

func runReplay(ctx context.Context, c *cli, args []string) error {
	fs := c.newFlags("replay", replayUsage)
	all := fs.Bool("all", false, "replay every dead letter that the filters select, oldest first")
	var f txhook.EventFilter
	fs.StringVar(&f.Source, "source", "", "with --all: only failed events of this source")
	fs.StringVar(&f.Type, "type", "", "with --all: only failed events of this type")
	fs.IntVar(&f.Limit, "limit", 1000, "with --all: replay at most N events")
	dryRun := fs.Bool("dry-run", false, "list the events that would be replayed; change nothing")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	switch {
	case *all && len(pos) > 0:
		return usagef("replay takes SOURCE KEY or --all, not both")
	case !*all && len(pos) != 2:
		return usagef("want SOURCE and KEY, or --all, got %d arguments", len(pos))
	case !*all && (f.Source != "" || f.Type != ""):
		return usagef("--source and --type go with --all")
	case f.Limit < 1:
		return usagef("--limit must be at least 1")
	case !*dryRun && c.cfg.NewProcessor == nil:
		return usagef("replay runs the application's handlers, which %s does not have: run it from the application's own binary (package github.com/txhook/txhook/cli), or list what it would replay with --dry-run", c.name)
	}
	pool, err := c.connectPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()

	var events []txhook.EventRecord
	if *all {
		if events, err = txhook.ListDeadLetters(ctx, pool, f); err != nil {
			return err
		}
	} else {
		e, err := txhook.GetEventRecord(ctx, pool, pos[0], pos[1])
		if errors.Is(err, txhook.ErrEventNotFound) {
			return fmt.Errorf("no event with source %q and key %q", pos[0], pos[1])
		}
		if err != nil {
			return err
		}
		if e.Status != txhook.StatusFailed {
			stuck, err := txhook.ListEvents(ctx, pool, txhook.EventFilter{Source: e.Source, Key: e.Key, Stuck: true})
			if err != nil {
				return err
			}
			if len(stuck) == 0 {
				return fmt.Errorf("event %s %s is %s, neither failed nor stuck: nothing to replay", cell(e.Source, 0), cell(e.Key, 0), e.Status)
			}
		}
		events = []txhook.EventRecord{e}
	}
	if *dryRun {
		n := 0
		for _, e := range events {
			if !e.HasPayload {
				fmt.Fprintf(c.stdout, "cannot replay %s %s (%s): payload not stored\n", cell(e.Source, 40), cell(e.Key, 60), cell(e.Type, 40))
				continue
			}
			n++
			state := "failed " + formatTime(e.CompletedAt)
			if e.Status != txhook.StatusFailed {
				state = "stuck " + string(e.Status)
			}
			fmt.Fprintf(c.stdout, "would replay %s %s (%s, %s, %s): %s\n", cell(e.Source, 40), cell(e.Key, 60),
				cell(e.Type, 40), plural(e.Attempts, "attempt"), state, cell(e.LastError, 80))
		}
		fmt.Fprintf(c.stdout, "would replay %d of %s\n", n, plural(len(events), "dead letter"))
		return nil
	}

	r, err := c.cfg.NewProcessor(ctx, pool)
	if err != nil {
		return fmt.Errorf("new processor: %w", err)
	}
	p := c.newProgress("replay", "replayed", "events")
	p.total = int64(len(events))
	var processed, failed, errs int
	for i, e := range events {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("stopped after %d of %d events: %w", i, len(events), err)
		}
		res, err := r.Replay(ctx, e.Source, e.Key)
		what := cell(e.Source, 40) + " " + cell(e.Key, 60)
		switch {
		case err != nil:
			errs++
			fmt.Fprintf(c.stdout, "not replayed %s: %v\n", what, err)
		case res.Outcome == txhook.OutcomeProcessed:
			processed++
			fmt.Fprintf(c.stdout, "replayed %s: processed\n", what)
		case res.Outcome == txhook.OutcomeDuplicate:
			fmt.Fprintf(c.stdout, "replayed %s: already done, nothing ran\n", what)
		case res.Outcome == txhook.OutcomeFailed:
			failed++
			fmt.Fprintf(c.stdout, "replayed %s: failed again, still a dead letter: %v\n", what, res.Err)
		case res.Outcome == txhook.OutcomeInFlight:
			errs++
			fmt.Fprintf(c.stdout, "not replayed %s: another replay or delivery holds the event; try again\n", what)
		default:
			fmt.Fprintf(c.stdout, "replayed %s: %s\n", what, res.Outcome)
		}
		if !p.tty { // on a terminal the lines above are the progress
			p.update(int64(i + 1))
		}
	}
	if *all {
		fmt.Fprintf(c.stdout, "%d of %s processed, %d failed again, %d not replayed\n", processed, plural(len(events), "dead letter"), failed, errs)
	}
	if failed+errs > 0 {
		return fmt.Errorf("%d of %s not processed", failed+errs, plural(len(events), "event"))
	}
	return nil
}

// plural is n and noun, with an s unless n is 1: "1 dead letter", "2 dead
// letters".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
