package txhook_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/internal/testdb"
)

func TestListEventsFilters(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	opsSeed(t, d.Pool, "done", "old-", 3, month)
	opsSeed(t, d.Pool, "done", "new-", 2, time.Minute)
	opsSeed(t, d.Pool, "failed", "fail-", 2, time.Hour)
	opsSeed(t, d.Pool, "in_progress", "stuck-", 1, 2*time.Hour)
	opsSeed(t, d.Pool, "queued", "queued-", 1, 30*time.Minute)

	keys := func(f txhook.EventFilter) string {
		t.Helper()
		evs, err := txhook.ListEvents(t.Context(), d.Pool, f)
		if err != nil {
			t.Fatal(err)
		}
		var ks []string
		for _, e := range evs {
			ks = append(ks, e.Key)
		}
		return strings.Join(ks, " ")
	}
	for _, c := range []struct {
		f    txhook.EventFilter
		want string
	}{
		// Newest first; rows of one age by key.
		{txhook.EventFilter{}, "new-1 new-2 queued-1 fail-1 fail-2 stuck-1 old-1 old-2 old-3"},
		{txhook.EventFilter{Limit: 3}, "new-1 new-2 queued-1"},
		{txhook.EventFilter{Status: txhook.StatusFailed}, "fail-1 fail-2"},
		{txhook.EventFilter{Status: txhook.StatusInProgress}, "stuck-1"},
		{txhook.EventFilter{Status: txhook.StatusQueued}, "queued-1"},
		{txhook.EventFilter{Since: time.Now().Add(-90 * time.Minute)}, "new-1 new-2 queued-1 fail-1 fail-2"},
		// Stuck without River's table: the lease-mode claim whose lease ended
		// (the queued row has no job to judge it by).
		{txhook.EventFilter{Stuck: true}, "stuck-1"},
		{txhook.EventFilter{Stuck: true, Status: txhook.StatusQueued}, ""},
		{txhook.EventFilter{Stuck: true, Source: "elsewhere"}, ""},
		{txhook.EventFilter{Key: "fail-2"}, "fail-2"},
		{txhook.EventFilter{Key: "stuck-1", Stuck: true}, "stuck-1"},
		{txhook.EventFilter{Key: "fail-1", Stuck: true}, ""},
		{txhook.EventFilter{Source: "elsewhere"}, ""},
		{txhook.EventFilter{Type: "thing.happened", Status: txhook.StatusDone, Limit: 1}, "new-1"},
	} {
		if got := keys(c.f); got != c.want {
			t.Errorf("ListEvents(%+v) = %q, want %q", c.f, got, c.want)
		}
	}
	if _, err := txhook.ListEvents(t.Context(), d.Pool, txhook.EventFilter{Status: "bogus"}); err == nil {
		t.Error("unknown status accepted")
	}
	if _, err := txhook.ListEvents(t.Context(), d.Pool, txhook.EventFilter{Limit: -1}); err == nil {
		t.Error("negative limit accepted")
	}
}

func TestGetEventRecord(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	opsSeed(t, d.Pool, "failed", "fail-", 1, time.Hour)
	rec, err := txhook.GetEventRecord(t.Context(), d.Pool, "test", "fail-1")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != txhook.StatusFailed || rec.LastError != "permanent: boom" || string(rec.Payload) != `{"n":1}` ||
		rec.PayloadSize != 7 || !rec.HasPayload || rec.CompletedAt.IsZero() {
		t.Errorf("record = %+v", rec)
	}
	if _, err := txhook.GetEventRecord(t.Context(), d.Pool, "test", "nope"); !errors.Is(err, txhook.ErrEventNotFound) {
		t.Errorf("missing event: error %v, want ErrEventNotFound", err)
	}
}

func TestReadStats(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	s, err := txhook.ReadStats(t.Context(), d.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if s.Total != 0 || len(s.Counts) != 0 || s.OldestInProgress != nil {
		t.Errorf("stats of an empty table = %+v", s)
	}

	opsSeed(t, d.Pool, "done", "done-", 4, time.Hour)
	opsSeed(t, d.Pool, "failed", "fail-", 2, time.Hour)
	opsSeed(t, d.Pool, "in_progress", "young-", 1, time.Minute)
	opsSeed(t, d.Pool, "in_progress", "old-", 1, 3*time.Hour)
	if _, err := d.Pool.Exec(t.Context(), "UPDATE txhook_processed_events SET source = 'github' WHERE event_key = 'done-4'"); err != nil {
		t.Fatal(err)
	}
	s, err = txhook.ReadStats(t.Context(), d.Pool)
	if err != nil {
		t.Fatal(err)
	}
	var counts []string
	for _, c := range s.Counts {
		counts = append(counts, c.Source+"/"+string(c.Status)+"="+strconv.FormatInt(c.Events, 10))
	}
	if got := strings.Join(counts, " "); got != "github/done=1 test/done=3 test/failed=2 test/in_progress=2" {
		t.Errorf("counts = %s", got)
	}
	if s.Total != 8 || s.Done != 4 || s.Failed != 2 || s.InProgress != 2 {
		t.Errorf("totals = %+v", s)
	}
	if o := s.OldestInProgress; o == nil || o.Key != "old-1" || time.Since(o.ClaimedAt) < 3*time.Hour-time.Minute {
		t.Errorf("oldest in progress = %+v, want old-1 claimed 3h ago", o)
	} else if d := o.ClaimedAge - 3*time.Hour; d < 0 || d > time.Minute ||
		(o.LeaseLeft-(o.LeaseExpiresAt.Sub(o.ClaimedAt)-o.ClaimedAge)).Abs() > 2*time.Millisecond {
		t.Errorf("oldest in progress: claimed %v ago, lease left %v; want 3h ago on the database's clock, and the lease's end that much after the claim", o.ClaimedAge, o.LeaseLeft)
	}
}
