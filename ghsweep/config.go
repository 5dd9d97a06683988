package ghsweep

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Hook names the webhook whose deliveries a Sweeper lists and redelivers: a
// repository's, an organization's, or a GitHub App's. Make one with
// RepoHook, OrgHook or AppHook.
type Hook struct {
	owner, repo string // a repository hook
	org         string // an organization hook
	app         bool   // the App's hook
	id          int64
}

// RepoHook is the webhook with the given id on the repository owner/repo.
func RepoHook(owner, repo string, id int64) Hook { return Hook{owner: owner, repo: repo, id: id} }

// OrgHook is the webhook with the given id on the organization org.
func OrgHook(org string, id int64) Hook { return Hook{org: org, id: id} }

// AppHook is the webhook of the GitHub App that Config.AppID names (an App
// has one).
func AppHook() Hook { return Hook{app: true} }

// String names the hook as GitHub's API paths do: "repos/OWNER/REPO/hooks/ID",
// "orgs/ORG/hooks/ID" or "app/hook". The sweeper records its runs under it.
func (h Hook) String() string {
	switch {
	case h.app:
		return "app/hook"
	case h.org != "":
		return fmt.Sprintf("orgs/%s/hooks/%d", h.org, h.id)
	case h.owner != "":
		return fmt.Sprintf("repos/%s/%s/hooks/%d", h.owner, h.repo, h.id)
	}
	return ""
}

// deliveries returns the hook's deliveries endpoint under base.
func (h Hook) deliveries(base *url.URL) *url.URL {
	switch {
	case h.app:
		return base.JoinPath("app", "hook", "deliveries")
	case h.org != "":
		return base.JoinPath("orgs", h.org, "hooks", fmt.Sprint(h.id), "deliveries")
	}
	return base.JoinPath("repos", h.owner, h.repo, "hooks", fmt.Sprint(h.id), "deliveries")
}

func (h Hook) validate() error {
	switch {
	case h.app:
		return nil
	case h.org != "":
		if h.id <= 0 {
			return fmt.Errorf("organization hook %s: hook id must be positive", h.org)
		}
		return nil
	case h.owner != "" || h.repo != "":
		if h.owner == "" || h.repo == "" || strings.Contains(h.owner, "/") || strings.Contains(h.repo, "/") {
			return fmt.Errorf("repository hook: want an owner and a repository name, got %q and %q", h.owner, h.repo)
		}
		if h.id <= 0 {
			return fmt.Errorf("repository hook %s/%s: hook id must be positive", h.owner, h.repo)
		}
		return nil
	}
	return fmt.Errorf("no hook: use RepoHook, OrgHook or AppHook")
}

// Config configures a Sweeper. The zero value of each field but Hook and the
// credential means its default.
type Config struct {
	// Hook is the webhook to sweep. Required.
	Hook Hook
	// Token authenticates repository and organization hooks: a personal
	// access token (fine-grained: "Webhooks" read and write on the
	// repository or organization; classic: repo or admin:repo_hook for a
	// repository, admin:org_hook for an organization) or a GitHub App
	// installation token with the same permission, which expires an hour
	// after it is minted (see the package doc). Never logged.
	Token string
	// AppID and AppPrivateKey authenticate an App hook: the App's client ID
	// (or its numeric app ID) and its private key in PEM, as GitHub offers
	// it for download. The sweeper signs a JSON Web Token with the key
	// (RS256) for each run. Never logged.
	AppID         string
	AppPrivateKey []byte
	// Source is the source name under which the receiving endpoint records
	// the hook's deliveries in the events table (handler.Config.Source);
	// a delivery's key is its guid (X-GitHub-Delivery). Defaults to "github".
	Source string
	// APIURL is the REST API's base URL. Defaults to https://api.github.com;
	// GitHub Enterprise Server's is https://HOST/api/v3.
	APIURL string
	// HTTPClient sends the requests. Defaults to a client with a 30s
	// timeout. The sweeper uses a copy whose CheckRedirect refuses any
	// redirect off the API's origin (its scheme, host and port) before
	// calling the client's own: the credential goes to that origin only.
	HTTPClient *http.Client
	// Window is how far back deliveries are read: GitHub redelivers
	// deliveries of the last 3 days only. Defaults to 72h.
	Window time.Duration
	// MaxPages bounds the pages of the deliveries listing one run reads; a
	// listing that goes on (or whose next page link repeats a page already
	// read) cuts the run short: the guids listed so far are swept, and the
	// run is recorded and returned as cut short. Defaults to the pages that
	// 20 deliveries a minute over Window fill at PerPage a page: 864 pages
	// for 72h at GitHub's 100 a page.
	MaxPages int
	// RunTimeout bounds one run: its listing stops at half of it, so that
	// what was listed is redelivered in the other half, and the run stops
	// at the end of it. A run stopped so is recorded and returned as cut
	// short, its lock released; the next run carries on. Defaults to 10
	// minutes.
	RunTimeout time.Duration
	// ResendAfter is how long a guid whose redelivery was requested is left
	// alone while GitHub shows no newer attempt at it. A newer attempt
	// that failed makes it eligible at once. Defaults to 15 minutes.
	ResendAfter time.Duration
	// Backoff spaces the requests for a guid that keeps failing: after its
	// k-th request, the guid is asked for again (after a newer failed
	// attempt, a refusal, or ResendAfter) only once Backoff * 2^(k-1) has
	// passed, at most 6 hours. A delivery the receiver keeps refusing (a
	// wrong secret, a body it rejects) is thus asked for about twenty
	// times over GitHub's 3 days, not on every run. Defaults to one minute.
	Backoff time.Duration
	// PerPage is the page size of the deliveries listing (GitHub's maximum
	// is 100). Defaults to 100.
	PerPage int
	// MaxRateLimitWait is the longest a run waits when GitHub's rate limit
	// asks it to; a longer wait ends the run with a *RateLimitError.
	// Defaults to one minute.
	MaxRateLimitWait time.Duration
	// PostPause is the least time between two redelivery requests, as GitHub
	// advises against its secondary rate limits. Defaults to one second; a
	// negative value means no pause.
	PostPause time.Duration
	// Logger receives one record per run and per redelivery. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

const (
	defaultAPIURL      = "https://api.github.com"
	defaultWindow      = 72 * time.Hour
	defaultResendAfter = 15 * time.Minute
	defaultBackoff     = time.Minute
	defaultPerPage     = 100
	defaultMaxWait     = time.Minute
	defaultPostPause   = time.Second
	defaultRunTimeout  = 10 * time.Minute
	// defaultRate is the deliveries a minute that MaxPages' default allows
	// for over the window.
	defaultRate = 20
)

// defaultMaxPages returns the pages that defaultRate deliveries a minute
// over window fill at perPage a page.
func defaultMaxPages(window time.Duration, perPage int) int {
	deliveries := int64(window/time.Minute) * defaultRate
	return int(max(1, min((deliveries+int64(perPage)-1)/int64(perPage), 1<<30)))
}
