package inbox_test

import (
	"slices"
	"testing"
	"time"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/inbox"
	"github.com/txhook/txhook/internal/pgtrace"
	"github.com/txhook/txhook/internal/testdb"
)

// TestAcceptTwoRoundTrips: on River, accepting an event takes two round
// trips, River's job insert travelling with BEGIN and the key's check, and
// a redelivery's insert is skipped by the server. River's driver asks the
// transaction for its configuration before each statement; were that
// answered by sending what the transaction holds back, the check would be
// a round trip of its own.
func TestAcceptTwoRoundTrips(t *testing.T) {
	t.Parallel()
	d := testdb.New(t, template)
	pool, tr := pgtrace.Pool(t, d.URL)
	routes := txhook.NewRoutes()
	routes.Inbox("github", "push", apply)
	proc, err := txhook.NewProcessor(pool, &txhook.Config{Routes: routes})
	if err != nil {
		t.Fatal(err)
	}
	// A cooldown long enough that only the first insert notifies River's
	// workers (River spaces an insert's notification by it, a round trip of
	// its own).
	cfg := riverConfig()
	cfg.FetchCooldown, cfg.FetchPollInterval = time.Hour, time.Hour
	if _, err := inbox.New(pool, proc, &inbox.Config{River: cfg}); err != nil {
		t.Fatal(err)
	}
	accept := func(key string) txhook.Outcome {
		t.Helper()
		res, err := proc.Deliver(t.Context(), txhook.Event{Source: "github", Key: key, Type: "push", Payload: []byte(`{}`)}, nil)
		if err != nil {
			t.Fatalf("Deliver %s: %v", key, err)
		}
		return res.Outcome
	}
	if got := accept("warm-up"); got != txhook.OutcomeQueued {
		t.Fatalf("warm-up: outcome %v, want queued", got)
	}
	tr.Take()
	if got := accept("k-1"); got != txhook.OutcomeQueued {
		t.Fatalf("new key: outcome %v, want queued", got)
	}
	first := []string{"begin", "CheckKeyNotRecorded", "JobInsertFastMany"}
	if got, want := tr.Take(), [][]string{first, {"QueueEventWithJob", "commit"}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("new key: round trips %q, want %q", got, want)
	}
	if got := accept("k-1"); got != txhook.OutcomeDuplicate {
		t.Fatalf("redelivery: outcome %v, want duplicate", got)
	}
	if got, want := tr.Take(), [][]string{first, {"rollback"}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("redelivery: round trips %q, want %q", got, want)
	}
	var jobs int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM river_job WHERE kind = $1`, inbox.Args{}.Kind()).Scan(&jobs); err != nil {
		t.Fatal(err)
	}
	if jobs != 2 {
		t.Errorf("%d jobs, want 2: the redelivery's insert must not run", jobs)
	}
}
