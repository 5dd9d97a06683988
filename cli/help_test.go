package cli

import (
	"strings"
	"testing"
)

// The end of dead-letters says how to replay with what the binary has: the
// txhook binary has no handlers (its replay refuses to run them), so it
// names the application's binary and console; an application's binary
// names its own replay. One dead letter is "1 dead letter".
func TestDeadLettersSaysHowToReplay(t *testing.T) {
	t.Parallel()
	f := newReplayFixture(t)
	code, out, errOut := runWith(t, env{}, nil, "--database-url", f.db.URL, "dead-letters", "--source", "github")
	if code != 0 || errOut != "" {
		t.Fatalf("txhook dead-letters: exit %d, %q", code, errOut)
	}
	for _, want := range []string{
		"\n1 dead letter shown, oldest first. Replay runs the application's handlers, which txhook does not have:\n",
		`replay from the application's own binary (package cli: "myapp txhook replay SOURCE KEY", or --all)`,
		"or with the Replay button of its operator console (package admin). txhook replay --all --dry-run lists what would run.\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("txhook dead-letters lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "Replay one: txhook replay") {
		t.Errorf("txhook dead-letters offers a replay that txhook refuses:\n%s", out)
	}
	// The replay it no longer offers is indeed refused.
	if code, _, errOut := runWith(t, env{}, nil, "--database-url", f.db.URL, "replay", "github", "gh_1"); code != 2 || !strings.Contains(errOut, "which txhook does not have") {
		t.Errorf("txhook replay: exit %d, %q; want 2, refused", code, errOut)
	}

	code, out, _ = f.run(t, "dead-letters", "--source", "github")
	if code != 0 || !strings.HasSuffix(out, "\n1 dead letter shown, oldest first. Replay one: app txhook replay SOURCE KEY; all of them: app txhook replay --all\n") {
		t.Errorf("app txhook dead-letters: exit %d\n%s", code, out)
	}
}

// events --help shows the flags of each subcommand (it showed only
// --database-url), and no help shows the database URL given, which may
// hold a password.
func TestEventsHelp(t *testing.T) {
	t.Parallel()
	code, out, errOut := txhookCLI(t, "--database-url", "postgres://u:secret@db.example/app", "events", "--help")
	if code != 0 || errOut != "" {
		t.Fatalf("txhook events --help: exit %d, %q", code, errOut)
	}
	for _, want := range []string{
		"Usage: txhook events SUBCOMMAND [flags]",
		"Usage: txhook events list [--source S]", "-since", "-status", "-type",
		"Usage: txhook events show [--json] SOURCE KEY",
		"Usage: txhook events redelivered [--source S] [--limit N] [--json]",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("txhook events --help lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "secret") {
		t.Errorf("txhook events --help shows the database URL:\n%s", out)
	}
	_, out, _ = txhookCLI(t, "--database-url", "postgres://u:secret@db.example/app", "prune", "--help")
	if !strings.Contains(out, "-database-url URL\n    \tPostgreSQL URL (default: $DATABASE_URL)\n") || strings.Contains(out, "secret") {
		t.Errorf("txhook prune --help shows the database URL, or not its flag:\n%s", out)
	}
}

// github --help shows the flags of its one subcommand, redeliver (it showed
// only --database-url), and says what --app-key-file stands in for.
func TestGitHubHelp(t *testing.T) {
	t.Parallel()
	code, out, errOut := txhookCLI(t, "github", "--help")
	if code != 0 || errOut != "" {
		t.Fatalf("txhook github --help: exit %d, %q", code, errOut)
	}
	for _, want := range []string{
		"Usage: txhook github SUBCOMMAND [flags]",
		"Usage: txhook github redeliver [flags]", "-max-pages", "-run-timeout", "-hook-id",
		"(without it: the PEM text in $GITHUB_APP_PRIVATE_KEY)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("txhook github --help lacks %q:\n%s", want, out)
		}
	}
}
