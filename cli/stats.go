package cli

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/ghsweep"
)

func runStats(ctx context.Context, c *cli, args []string) error {
	fs := c.newFlags("stats", "stats [--json]")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	conn, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer closeConn(conn)
	s, err := txhook.ReadStats(ctx, conn)
	if err != nil {
		return err
	}
	runs, err := sweeperRuns(ctx, conn)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(c.stdout, struct {
			txhook.Stats
			RedeliverySweeper []ghsweep.RunRecord `json:"redelivery_sweeper,omitempty"`
		}{s, runs})
	}
	if len(s.Counts) == 0 {
		fmt.Fprintln(c.stdout, "no events")
		writeSweeperRuns(c.stdout, runs, time.Now())
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SOURCE\tQUEUED\tIN PROGRESS\tDONE\tFAILED\tTOTAL")
	var row struct {
		source                        string
		queued, inProgress, done, bad int64
	}
	flush := func() {
		if row.source != "" {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\n", cell(row.source, 40), row.queued, row.inProgress, row.done, row.bad,
				row.queued+row.inProgress+row.done+row.bad)
		}
	}
	for _, sc := range s.Counts {
		if sc.Source != row.source {
			flush()
			row.source, row.queued, row.inProgress, row.done, row.bad = sc.Source, 0, 0, 0, 0
		}
		switch sc.Status {
		case txhook.StatusQueued:
			row.queued = sc.Events
		case txhook.StatusInProgress:
			row.inProgress = sc.Events
		case txhook.StatusDone:
			row.done = sc.Events
		case txhook.StatusFailed:
			row.bad = sc.Events
		}
	}
	flush()
	fmt.Fprintf(tw, "(all)\t%d\t%d\t%d\t%d\t%d\n", s.Queue.Queued, s.InProgress, s.Done, s.Failed, s.Total)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "\nfailed events: %d", s.Failed)
	if s.Failed > 0 {
		fmt.Fprintf(c.stdout, " (%s dead-letters)", c.name)
	}
	fmt.Fprintln(c.stdout)
	if o := s.OldestInProgress; o != nil {
		// Ages on the database's clock, which stamped the claim.
		lease := "expires in " + o.LeaseLeft.Round(time.Second).String()
		if o.LeaseLeft <= 0 {
			lease = "expired " + (-o.LeaseLeft).Round(time.Second).String() + " ago"
		}
		fmt.Fprintf(c.stdout, "oldest in-progress lease: %s %s, claimed %s ago (attempt %d), lease %s\n",
			cell(o.Source, 40), cell(o.Key, 60), o.ClaimedAge.Round(time.Second), o.Attempts, lease)
	} else {
		fmt.Fprintln(c.stdout, "oldest in-progress lease: none")
	}
	writeQueue(c.stdout, s)
	writeSweeperRuns(c.stdout, runs, time.Now())
	return nil
}
