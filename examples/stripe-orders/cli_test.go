package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestProcessTxhookSubcommandReplays runs "stripe-orders txhook ..." as a
// process: txhook's commands, with replay running the example's handlers.
func TestProcessTxhookSubcommandReplays(t *testing.T) {
	t.Parallel()
	f := setup(t, "")
	s, o := f.deliver(t, checkout(t, "evt_cli", "cs_cli", "cus_cli", nil)) // no amount: a dead letter
	wantAnswer(t, s, o, 200, "failed")
	// The stored payload completed, standing in for a fixed handler.
	if _, err := f.db.Pool.Exec(t.Context(), `UPDATE txhook_processed_events SET payload = $1 WHERE event_key = 'evt_cli'`,
		checkout(t, "evt_cli", "cs_cli", "cus_cli", 990)); err != nil {
		t.Fatal(err)
	}
	txhookCmd := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		cmd := command(ctx, t, "DATABASE_URL="+f.db.URL)
		cmd.Args = append(cmd.Args, append([]string{"txhook"}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	if out, err := txhookCmd("--help"); err != nil || !strings.Contains(out, "Usage: stripe-orders txhook [--database-url URL] COMMAND") {
		t.Errorf("stripe-orders txhook --help: %v\n%s", err, out)
	}
	if out, err := txhookCmd("dead-letters"); err != nil || !strings.Contains(out, "evt_cli") {
		t.Errorf("stripe-orders txhook dead-letters: %v\n%s", err, out)
	}
	if out, err := txhookCmd("replay", "stripe", "evt_cli"); err != nil || out != "replayed stripe evt_cli: processed\n" {
		t.Errorf("stripe-orders txhook replay: %v\n%s", err, out)
	}
	if n := f.count(t, "SELECT count(*) FROM orders WHERE checkout_session_id = 'cs_cli'"); n != 1 || f.total(t, "cus_cli") != 990 {
		t.Errorf("after the replay: %d orders, total %d; want 1 and 990", n, f.total(t, "cus_cli"))
	}
}
