// Package ghsweep redelivers the GitHub webhook deliveries that never
// reached the database: a receiver that was down, being deployed, cut off
// from PostgreSQL, or too slow for GitHub's 10-second timeout.
//
// GitHub never retries a failed delivery on its own. It keeps the last
// three days of a webhook's deliveries and redelivers one when asked,
// through its REST API or the "Recent Deliveries" page. A Sweeper does the
// asking, and unlike a script that redelivers every failure blindly it
// knows which deliveries txhook already applied:
//
//   - it lists the hook's deliveries of the last three days (GitHub's
//     "list deliveries for a webhook" endpoint, page by page through the
//     Link header);
//   - it skips, and logs, a listed delivery whose guid or event name cannot
//     be an event's key or type (txhook.Event.Validate);
//   - it keeps the guids none of whose attempts was answered 2xx;
//   - it drops the guids settled in the events table under Config.Source
//     (the delivery's guid is its X-GitHub-Delivery header, txhook's key):
//     a settled guid is never redelivered;
//   - it drops the guids whose redelivery it already requested and GitHub
//     has not attempted yet (Config.ResendAfter);
//   - it asks GitHub to redeliver each of the rest once (the "redeliver a
//     delivery" endpoint, POST .../deliveries/{id}/attempts), recording the
//     request first in txhook_redeliveries.
//
// A run holds a PostgreSQL advisory lock for its hook, so two sweepers (two
// instances of an application, or cron and an application) never sweep one
// hook at once; and the record written before each request keeps even
// sweepers that do not share the lock from requesting one guid twice.
// Each run's outcome is kept in txhook_sweeper_runs; txhook stats shows it.
//
// A run is bounded whatever the API answers: its listing stops at a next
// page link that repeats a page already read, at Config.MaxPages, and at
// half of Config.RunTimeout, and the run itself at RunTimeout. A run so cut
// short still redelivers what it listed, then says so (Result.CutShort, its
// error, and its record), and releases the lock for the next run.
//
// # Hooks and credentials
//
// Repository and organization hooks (RepoHook, OrgHook) authenticate with
// Config.Token: a fine-grained personal access token with the "Webhooks"
// permission (read and write) on the repository or organization, a classic
// token with the repo or admin:repo_hook scope (repository) or
// admin:org_hook (organization), or an App installation token with the
// same permission; an installation token expires an hour after it is
// minted, so mint one per run and pass it to a Sweeper made for that run
// (New is cheap and a Sweeper keeps nothing between runs but what is in
// the database). A GitHub App's own hook (AppHook) authenticates as the
// App: Config.AppID and Config.AppPrivateKey, from which each run signs a
// JSON Web Token (RS256). The credential is never logged nor put in an
// error, and it goes to the API's origin only: a redirect to another
// scheme, host or port is refused, whatever Config.HTTPClient does.
//
// # Running it
//
// Run sweeps once: call it from cron through the command line (txhook
// github redeliver), from a job queue's periodic job, or let RunEvery call
// it on a ticker in a goroutine of the receiving application.
//
//	sw, err := ghsweep.New(pool, &ghsweep.Config{
//		Hook:  ghsweep.RepoHook("octo-org", "octo-repo", 12345678),
//		Token: os.Getenv("GITHUB_TOKEN"),
//	})
//	if err != nil {
//		return err
//	}
//	go sw.RunEvery(ctx, 5*time.Minute)
//
// GitHub's rate limits are honoured: a run waits as GitHub's
// x-ratelimit-remaining, x-ratelimit-reset and retry-after headers ask, up
// to Config.MaxRateLimitWait, and otherwise stops with a *RateLimitError;
// redelivery requests are spaced by Config.PostPause. Other answers outside
// 2xx are *APIError values.
//
// The package speaks to GitHub with net/http and encoding/json only, and
// signs App tokens with crypto/rsa: txhook's core module keeps its
// dependencies few, and the two endpoints it needs do not warrant a GitHub
// client library.
package ghsweep
