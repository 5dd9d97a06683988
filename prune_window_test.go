package txhook_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
)

// unreachable is a database that never begins a transaction.
type unreachable struct{}

func (unreachable) BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error) {
	return nil, errors.New("no database")
}

// TestPrunerWarnsBelowReplayWindow: a Pruner whose retention is shorter
// than the body dedupe window of the guarded endpoints says so when it starts.
func TestPrunerWarnsBelowReplayWindow(t *testing.T) {
	t.Parallel()
	day := 24 * time.Hour
	for _, tc := range []struct {
		name          string
		retention     time.Duration
		window        time.Duration
		wantWarning   bool
		wantRetention string
	}{
		{"defaults", 0, 0, false, ""},
		{"3 days under the default window", 3 * day, 0, true, "72h0m0s"},
		{"no guarded endpoint", 3 * day, -1, false, ""},
		{"default retention under a longer window", 0, 30 * day, true, "336h0m0s"},
		{"retention equal to the window", 7 * day, 7 * day, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs bytes.Buffer
			pr, err := txhook.NewPruner(unreachable{}, &txhook.PrunerConfig{
				Options:          txhook.PruneOptions{OlderThan: tc.retention},
				BodyDedupeWindow: tc.window,
				Logger:           slog.New(slog.NewTextHandler(&logs, nil)),
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			cancel() // one run, which fails at once, then Run returns
			pr.Run(ctx)
			got := strings.Contains(logs.String(), "shorter than the body dedupe window")
			if got != tc.wantWarning {
				t.Errorf("warning logged = %v, want %v; logs:\n%s", got, tc.wantWarning, logs.String())
			}
			if tc.wantWarning && !strings.Contains(logs.String(), "retention="+tc.wantRetention) {
				t.Errorf("warning without the retention %s: %s", tc.wantRetention, logs.String())
			}
		})
	}
}
