package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/ghsweep"
)

func runGitHub(ctx context.Context, c *cli, args []string) error {
	if len(args) > 0 && args[0] == "redeliver" {
		return runGitHubRedeliver(ctx, c, args[1:])
	}
	fs := c.newFlags("github", "github redeliver [flags]")
	fs.Usage = func() {
		// The one subcommand's usage and flags, as events --help shows its
		// subcommands'.
		fmt.Fprintf(c.stdout, "Usage: %s github SUBCOMMAND [flags]\n\nSubcommands:\n  %-13s %s\n\n", c.name, "redeliver", "ask GitHub to redeliver the webhook's failed deliveries")
		runGitHubRedeliver(ctx, c, []string{"--help"}) // prints its usage; returns flag.ErrHelp
	}
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("missing subcommand: redeliver")
	}
	return usagef("unknown subcommand %q: want redeliver", pos[0])
}

const githubRedeliverUsage = `github redeliver [flags]

Lists the webhook's deliveries of the last 3 days and asks GitHub to redeliver
each one that failed and whose guid (X-GitHub-Delivery) is not settled in the
events table under --source. Run it from cron every few minutes; concurrent
runs on one hook take turns.

The hook: --repo OWNER/NAME --hook-id ID, --org ORG --hook-id ID, or --app.
Credentials come from the environment only: GITHUB_TOKEN (repository and
organization hooks), or GITHUB_APP_ID and GITHUB_APP_PRIVATE_KEY (the PEM
text) or --app-key-file (App hooks). See docs/github-sweeper.md for the
permissions they need.`

func runGitHubRedeliver(ctx context.Context, c *cli, args []string) error {
	fs := c.newFlags("github redeliver", githubRedeliverUsage)
	repo := fs.String("repo", "", "repository OWNER/NAME of a repository hook (default: $GITHUB_REPOSITORY)")
	org := fs.String("org", "", "organization of an organization hook")
	app := fs.Bool("app", false, "the GitHub App's hook (needs GITHUB_APP_ID and a private key)")
	hookID := fs.String("hook-id", "", "hook id of a repository or organization hook (default: $GITHUB_HOOK_ID)")
	appKeyFile := fs.String("app-key-file", "", "file holding the App's private key in PEM (without it: the PEM text in $GITHUB_APP_PRIVATE_KEY)")
	cfg := ghsweep.Config{}
	fs.StringVar(&cfg.Source, "source", "github", "source name of the GitHub endpoint in the events table")
	fs.StringVar(&cfg.APIURL, "api-url", "", "REST API base URL (default: $GITHUB_API_URL, else https://api.github.com)")
	fs.DurationVar(&cfg.ResendAfter, "resend-after", 15*time.Minute, "leave a requested redelivery alone this long while GitHub shows no newer attempt")
	fs.DurationVar(&cfg.Backoff, "backoff", time.Minute, "wait before asking again for a delivery whose redelivery failed too, doubled with each request")
	fs.DurationVar(&cfg.MaxRateLimitWait, "max-wait", time.Minute, "longest wait on GitHub's rate limit before giving up")
	fs.IntVar(&cfg.MaxPages, "max-pages", 0, "most pages of the listing one run reads (default: 20 deliveries a minute over 3 days, 864 pages)")
	fs.DurationVar(&cfg.RunTimeout, "run-timeout", 10*time.Minute, "bound of one run; its listing stops at half of it")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	// $GITHUB_REPOSITORY names the repository unless another hook is named.
	if *repo == "" && *org == "" && !*app {
		*repo = os.Getenv("GITHUB_REPOSITORY")
	}
	kinds := 0
	for _, set := range []bool{*repo != "", *org != "", *app} {
		if set {
			kinds++
		}
	}
	if kinds != 1 {
		return usagef("name one hook: --repo OWNER/NAME, --org ORG or --app")
	}
	if cfg.APIURL == "" {
		cfg.APIURL = os.Getenv("GITHUB_API_URL")
	}
	if cfg.MaxPages < 0 || cfg.RunTimeout <= 0 {
		return usagef("--max-pages must not be negative and --run-timeout must be positive")
	}
	switch {
	case *app:
		cfg.Hook = ghsweep.AppHook()
		cfg.AppID = os.Getenv("GITHUB_APP_ID")
		cfg.AppPrivateKey = []byte(os.Getenv("GITHUB_APP_PRIVATE_KEY"))
		if *appKeyFile != "" {
			if cfg.AppPrivateKey, err = os.ReadFile(*appKeyFile); err != nil {
				return fmt.Errorf("read App private key: %w", err)
			}
		}
		if cfg.AppID == "" || len(cfg.AppPrivateKey) == 0 {
			return usagef("--app needs GITHUB_APP_ID and a private key (GITHUB_APP_PRIVATE_KEY or --app-key-file)")
		}
	default:
		if *hookID == "" {
			*hookID = os.Getenv("GITHUB_HOOK_ID")
		}
		id, err := strconv.ParseInt(*hookID, 10, 64)
		if err != nil || id <= 0 {
			return usagef("--hook-id must be the hook's positive id, got %q", *hookID)
		}
		if *org != "" {
			cfg.Hook = ghsweep.OrgHook(*org, id)
		} else {
			owner, name, ok := strings.Cut(*repo, "/")
			if !ok || owner == "" || name == "" || strings.Contains(name, "/") {
				return usagef("--repo must be OWNER/NAME, got %q", *repo)
			}
			cfg.Hook = ghsweep.RepoHook(owner, name, id)
		}
		cfg.Token = os.Getenv("GITHUB_TOKEN")
		if cfg.Token == "" {
			return usagef("no token: set GITHUB_TOKEN (never passed as a flag, so that it stays out of process listings)")
		}
	}
	pool, err := c.connectPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	// The result and the error are printed; the warnings (a refused
	// redelivery, a listed delivery skipped) go to stderr.
	cfg.Logger = slog.New(warningsOnly{slog.NewTextHandler(c.stderr, nil)})
	sw, err := ghsweep.New(pool, &cfg)
	if err != nil {
		return err
	}
	res, runErr := sw.Run(ctx)
	if *asJSON {
		out := struct {
			ghsweep.Result
			Error string `json:"error,omitempty"`
		}{Result: res}
		if runErr != nil {
			out.Error = runErr.Error()
		}
		if err := writeJSON(c.stdout, out); err != nil {
			return err
		}
		return runErr
	}
	if res.Busy {
		fmt.Fprintf(c.stdout, "%s: another sweeper is running on this hook; nothing done\n", cfg.Hook)
		return runErr
	}
	// A run that did not go to the end says so first, and what it did
	// before it stopped: a mail from cron must not read as a clean run.
	switch {
	case res.CutShort != "":
		fmt.Fprintf(c.stdout, "%s: run cut short: %s; before that it ", cfg.Hook, res.CutShort)
	case runErr != nil:
		fmt.Fprintf(c.stdout, "%s: run failed (the error follows on stderr); before that it ", cfg.Hook)
	default:
		fmt.Fprintf(c.stdout, "%s: ", cfg.Hook)
	}
	fmt.Fprintf(c.stdout, "listed %d deliveries (%d new); %d failed: %d settled, %d in flight, %d waiting for an earlier redelivery, %d redelivered, %d refused",
		res.Deliveries, res.New, res.Failed, res.Settled, res.InFlight, res.Waiting, len(res.Redelivered), res.Refused)
	if res.Skipped > 0 {
		fmt.Fprintf(c.stdout, "; %d skipped: their guid or event cannot be a key (logged on stderr)", res.Skipped)
	}
	fmt.Fprintln(c.stdout)
	for _, g := range res.Redelivered {
		fmt.Fprintf(c.stdout, "redelivered %s\n", cell(g, 0))
	}
	return runErr
}

// warningsOnly passes on the sweeper's warnings only: its record of the
// run (info, or error when the run failed) is what the command prints.
type warningsOnly struct{ slog.Handler }

func (h warningsOnly) Enabled(_ context.Context, l slog.Level) bool { return l == slog.LevelWarn }

func (h warningsOnly) WithAttrs(attrs []slog.Attr) slog.Handler {
	return warningsOnly{h.Handler.WithAttrs(attrs)}
}

func (h warningsOnly) WithGroup(name string) slog.Handler {
	return warningsOnly{h.Handler.WithGroup(name)}
}

// runEventsRedelivered lists the redeliveries the sweeper requested.
func runEventsRedelivered(ctx context.Context, c *cli, args []string) error {
	fs := c.newFlags("events redelivered", "events redelivered [--source S] [--limit N] [--json]")
	source := fs.String("source", "", "only redeliveries of this source")
	limit := fs.Int("limit", 50, "show at most N, newest request first")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	if *limit < 1 {
		return usagef("--limit must be at least 1")
	}
	conn, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer closeConn(conn)
	rds, err := ghsweep.ListRedeliveries(ctx, conn, *source, *limit)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(c.stdout, rds)
	}
	if len(rds) == 0 {
		fmt.Fprintln(c.stdout, "no redeliveries")
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SOURCE\tGUID\tEVENT\tHOOK\tSTATUS\tREQUESTS\tFIRST FAILED\tREQUESTED\tSETTLED\tLAST ERROR")
	for _, r := range rds {
		settled := "no"
		e, err := txhook.GetEventRecord(ctx, conn, r.Source, r.GUID)
		if err == nil && e.Status != txhook.StatusInProgress {
			settled = string(e.Status)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n",
			cell(r.Source, 40), cell(r.GUID, 60), cell(r.Event, 30), cell(r.Hook, 60), r.Status, r.Requests,
			formatTime(r.FirstFailedAt), formatTime(r.RequestedAt), settled, cell(r.LastError, 60))
	}
	return tw.Flush()
}

// sweeperRuns reads the sweeper's last runs, for stats.
func sweeperRuns(ctx context.Context, q txhook.Querier) ([]ghsweep.RunRecord, error) {
	return ghsweep.ListRuns(ctx, q)
}

// writeSweeperRuns prints when the redelivery sweeper last ran on each hook;
// nothing when it never ran.
func writeSweeperRuns(w io.Writer, runs []ghsweep.RunRecord, now time.Time) {
	for _, r := range runs {
		fmt.Fprintf(w, "redelivery sweeper %s %s: last ran %s ago: %d deliveries, %d failed, %d settled, %d redelivered (%d in all)",
			cell(r.Source, 40), cell(r.Hook, 60), now.Sub(r.FinishedAt).Round(time.Second), r.Deliveries, r.Failed, r.Settled, r.Redelivered, r.TotalRedelivered)
		if r.LastError != "" {
			fmt.Fprintf(w, "; error: %s", cell(r.LastError, 200))
		}
		fmt.Fprintln(w, " (txhook events redelivered)")
	}
}
