package cli

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook/internal/fakegithub"
	"github.com/txhook/txhook/internal/testdb"
)

// TestGitHubRedeliver runs txhook github redeliver against a fake GitHub:
// it redelivers the failed, unsettled guid only, a second run requests
// nothing, and events redelivered and stats show what it did; the token
// appears in no output.
func TestGitHubRedeliver(t *testing.T) {
	const token = "ghp_cliTokenNeverPrinted"
	d := testdb.New(t)
	gh := fakegithub.New(fakegithub.Config{Hook: "repos/octo/hello/hooks/42", Token: token})
	api := httptest.NewServer(gh)
	t.Cleanup(api.Close)
	gh.Add(fakegithub.Delivery{GUID: "g-settled", Event: "push", StatusCode: 502, DeliveredAt: time.Now().Add(-time.Hour)})
	gh.Add(fakegithub.Delivery{GUID: "g-lost", Event: "push", StatusCode: 0, DeliveredAt: time.Now().Add(-time.Hour)})
	gh.Add(fakegithub.Delivery{GUID: "g-ok", Event: "push", StatusCode: 200})
	if _, err := d.Pool.Exec(t.Context(), `INSERT INTO txhook_processed_events (source, event_key, status, completed_at)
		VALUES ('github', 'g-settled', 'done', now())`); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GITHUB_API_URL", api.URL)
	t.Setenv("GITHUB_TOKEN", "")
	t.Setenv("GITHUB_REPOSITORY", "")
	t.Setenv("GITHUB_HOOK_ID", "")

	for _, c := range []struct {
		args   []string
		stderr string
	}{
		{[]string{"github"}, "missing subcommand"},
		{[]string{"github", "redeliver"}, "name one hook"},
		{[]string{"github", "redeliver", "--repo", "octo/hello", "--org", "octo"}, "name one hook"},
		{[]string{"github", "redeliver", "--repo", "octo", "--hook-id", "42"}, "--repo must be OWNER/NAME"},
		{[]string{"github", "redeliver", "--repo", "octo/hello"}, "--hook-id"},
		{[]string{"github", "redeliver", "--repo", "octo/hello", "--hook-id", "42"}, "set GITHUB_TOKEN"},
		{[]string{"github", "redeliver", "--app"}, "GITHUB_APP_ID"},
	} {
		code, out, errOut := txhookCLI(t, append([]string{"--database-url", d.URL}, c.args...)...)
		if code != 2 || !strings.Contains(errOut, c.stderr) || out != "" {
			t.Errorf("txhook %q: exit %d, stdout %q, stderr %q; want exit 2 and %q", c.args, code, out, errOut, c.stderr)
		}
	}

	t.Setenv("GITHUB_TOKEN", token)
	t.Setenv("GITHUB_REPOSITORY", "octo/hello")
	t.Setenv("GITHUB_HOOK_ID", "42")
	out := mustRun(t, d.URL, "github", "redeliver")
	if !strings.Contains(out, "listed 3 deliveries (3 new); 2 failed: 1 settled, 0 in flight, 0 waiting for an earlier redelivery, 1 redelivered") ||
		!strings.Contains(out, "redelivered g-lost\n") {
		t.Errorf("github redeliver printed %q", out)
	}
	if got := gh.Redeliveries(); !slices.Equal(got, []string{"g-lost"}) {
		t.Fatalf("redelivered %q, want g-lost", got)
	}
	out2 := mustRun(t, d.URL, "github", "redeliver", "--json")
	if !strings.Contains(out2, `"waiting": 1`) || len(gh.Redeliveries()) != 1 {
		t.Errorf("second run: %q, %d redeliveries; want 1 waiting and no new request", out2, len(gh.Redeliveries()))
	}
	events := mustRun(t, d.URL, "events", "redelivered")
	if !strings.Contains(events, "g-lost") || !strings.Contains(events, "repos/octo/hello/hooks/42") || strings.Contains(events, "g-settled") {
		t.Errorf("events redelivered printed %q", events)
	}
	stats := mustRun(t, d.URL, "stats")
	if !strings.Contains(stats, "redelivery sweeper github repos/octo/hello/hooks/42: last ran") || !strings.Contains(stats, "(1 in all)") {
		t.Errorf("stats printed %q", stats)
	}
	if js := mustRun(t, d.URL, "stats", "--json"); !strings.Contains(js, `"redelivery_sweeper"`) || !strings.Contains(js, `"total_redelivered": 1`) {
		t.Errorf("stats --json printed %q", js)
	}

	// A wrong token: a clear error, exit 1, a summary that says the run
	// failed, and the token in no output.
	t.Setenv("GITHUB_TOKEN", token+"x")
	code, out, errOut := txhookCLI(t, "--database-url", d.URL, "github", "redeliver")
	if code != 1 || !strings.Contains(errOut, "401 Unauthorized") || !strings.HasPrefix(out, "repos/octo/hello/hooks/42: run failed") {
		t.Errorf("wrong token: exit %d, stdout %q, stderr %q; want 1, run failed and the 401", code, out, errOut)
	}
	code, outJSON, _ := txhookCLI(t, "--database-url", d.URL, "github", "redeliver", "--json")
	if code != 1 || !strings.Contains(outJSON, `"error": "ghsweep: github: GET`) {
		t.Errorf("wrong token, --json: exit %d, stdout %q; want 1 and the error in the JSON", code, outJSON)
	}
	for _, s := range []string{out, errOut, outJSON, out2, events, stats} {
		if strings.Contains(s, "cliTokenNeverPrinted") {
			t.Errorf("the token was printed: %q", s)
		}
	}
}

// TestGitHubRedeliverCutShort: a run cut short says so on stdout, first,
// and stats shows it; a listed delivery whose guid cannot be a key is
// counted as skipped and logged on stderr.
func TestGitHubRedeliverCutShort(t *testing.T) {
	const token = "ghp_cliToken"
	d := testdb.New(t)
	gh := fakegithub.New(fakegithub.Config{Hook: "repos/octo/hello/hooks/42", Token: token})
	gh.Add(fakegithub.Delivery{GUID: "g-lost", Event: "push", StatusCode: 502, DeliveredAt: time.Now().Add(-time.Hour)})
	gh.Add(fakegithub.Delivery{GUID: "g-\x00", Event: "push", StatusCode: 502, DeliveredAt: time.Now().Add(-time.Hour)})
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", fmt.Sprintf(`<%s>; rel="next"`, r.URL.RequestURI())) // the same page again
		gh.ServeHTTP(w, r)
	}))
	t.Cleanup(api.Close)
	t.Setenv("GITHUB_API_URL", api.URL)
	t.Setenv("GITHUB_TOKEN", token)
	t.Setenv("GITHUB_REPOSITORY", "octo/hello")
	t.Setenv("GITHUB_HOOK_ID", "42")
	code, out, errOut := txhookCLI(t, "--database-url", d.URL, "github", "redeliver")
	if code != 1 || !strings.HasPrefix(out, "repos/octo/hello/hooks/42: run cut short: the listing's next page link repeats a page already read; before that it listed 2 deliveries") ||
		!strings.Contains(out, "1 redelivered, 0 refused; 1 skipped") || !strings.Contains(out, "redelivered g-lost\n") {
		t.Errorf("github redeliver: exit %d, stdout %q; want 1, the cut named first, g-lost redelivered and 1 skipped", code, out)
	}
	if !strings.Contains(errOut, "listed delivery skipped") || !strings.Contains(errOut, "run cut short") || strings.Contains(errOut, "redelivery sweep failed") {
		t.Errorf("stderr %q: want the skipped delivery's warning and the error, not the run's own log record", errOut)
	}
	if stats := mustRun(t, d.URL, "stats"); !strings.Contains(stats, "run cut short: the listing's next page link repeats") {
		t.Errorf("stats printed %q, want the run cut short", stats)
	}
}

// TestGitHubRedeliverHelp: each flag's default is said once.
func TestGitHubRedeliverHelp(t *testing.T) {
	t.Setenv("GITHUB_API_URL", "https://github.example.com/api/v3")
	t.Setenv("GITHUB_REPOSITORY", "octo/hello")
	t.Setenv("GITHUB_HOOK_ID", "42")
	code, out, _ := txhookCLI(t, "github", "redeliver", "--help")
	if code != 0 {
		t.Fatalf("github redeliver --help: exit %d", code)
	}
	flags := strings.Split(out, "\n  -")[1:]
	if len(flags) < 10 {
		t.Fatalf("help %q: want its flags", out)
	}
	for _, f := range flags {
		if n := strings.Count(f, "default"); n > 1 {
			t.Errorf("flag -%s: says default %d times", f, n)
		}
	}
}
