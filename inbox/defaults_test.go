package inbox

import (
	"testing"
	"time"

	"github.com/riverqueue/river"
)

// TestRiverConfigDefaults: settings River.Config leaves zero get the
// inbox's defaults (River's own fetch cadence caps a queue at MaxWorkers
// jobs per 100 ms); settings it sets are kept, and a default never breaks
// River's rule that the poll interval is at least the cooldown.
func TestRiverConfigDefaults(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name           string
		river          *river.Config
		cooldown, poll time.Duration
	}{
		{"nil", nil, DefaultFetchCooldown, DefaultFetchPollInterval},
		{"zero", &river.Config{}, DefaultFetchCooldown, DefaultFetchPollInterval},
		{"both set", &river.Config{FetchCooldown: time.Millisecond, FetchPollInterval: 2 * time.Millisecond}, time.Millisecond, 2 * time.Millisecond},
		{"long cooldown", &river.Config{FetchCooldown: 200 * time.Millisecond}, 200 * time.Millisecond, 200 * time.Millisecond},
		{"short poll", &river.Config{FetchPollInterval: 2 * time.Millisecond}, 2 * time.Millisecond, 2 * time.Millisecond},
		{"long poll", &river.Config{FetchPollInterval: 5 * time.Second}, DefaultFetchCooldown, 5 * time.Second},
	} {
		rc := riverConfig(Config{River: c.river, Queue: QueueName, MaxWorkers: DefaultMaxWorkers})
		if rc.FetchCooldown != c.cooldown || rc.FetchPollInterval != c.poll {
			t.Errorf("%s: FetchCooldown %v, FetchPollInterval %v; want %v, %v", c.name, rc.FetchCooldown, rc.FetchPollInterval, c.cooldown, c.poll)
		}
		if got := rc.Queues[QueueName].MaxWorkers; got != DefaultMaxWorkers {
			t.Errorf("%s: the queue's MaxWorkers %d, want %d", c.name, got, DefaultMaxWorkers)
		}
	}
	own := riverConfig(Config{River: &river.Config{Queues: map[string]river.QueueConfig{"q": {MaxWorkers: 3}}}, Queue: "q", MaxWorkers: DefaultMaxWorkers})
	if got := own.Queues["q"].MaxWorkers; got != 3 {
		t.Errorf("a queue of River.Queues: MaxWorkers %d, want its own 3", got)
	}
}
