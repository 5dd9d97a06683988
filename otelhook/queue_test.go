package otelhook_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/internal/testdb"
	"github.com/txhook/txhook/otelhook"
)

func TestMain(m *testing.M) { testdb.Main(m) }

func TestObserveQueue(t *testing.T) {
	t.Parallel()
	d := testdb.New(t)
	reader := sdkmetric.NewManualReader()
	reg, err := otelhook.ObserveQueue(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), d.Pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Unregister() })
	gauges := func() (int64, float64) {
		t.Helper()
		got := collect(t, reader)
		q, ok1 := got["txhook.inbox.queued"].(metricdata.Gauge[int64])
		a, ok2 := got["txhook.inbox.oldest_queued_age"].(metricdata.Gauge[float64])
		if !ok1 || !ok2 || len(q.DataPoints) != 1 || len(a.DataPoints) != 1 {
			t.Fatalf("queue gauges missing: %+v", got)
		}
		return q.DataPoints[0].Value, a.DataPoints[0].Value
	}
	if n, age := gauges(); n != 0 || age != 0 {
		t.Fatalf("empty queue: queued %d, oldest age %v; want 0 and 0", n, age)
	}
	routes := txhook.NewRoutes()
	routes.Inbox("github", "", func(context.Context, pgx.Tx, txhook.Event) error { return nil })
	proc, err := txhook.NewProcessor(d.Pool, &txhook.Config{Routes: routes})
	if err != nil {
		t.Fatal(err)
	}
	if err := proc.UseQueue(jobOne{}); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"q-1", "q-2", "q-3"} {
		if res, err := proc.Deliver(t.Context(), txhook.Event{Source: "github", Key: key}, nil); err != nil || res.Outcome != txhook.OutcomeQueued {
			t.Fatalf("deliver %s: %v, %v; want queued", key, res.Outcome, err)
		}
	}
	if _, err := d.Pool.Exec(t.Context(), `UPDATE txhook_processed_events SET created_at = now() - interval '1 minute' WHERE event_key = 'q-2'`); err != nil {
		t.Fatal(err)
	}
	if n, age := gauges(); n != 3 || age < 59 || age > 90 {
		t.Fatalf("queue: queued %d, oldest age %vs; want 3 and about 60s", n, age)
	}
}

// jobOne is a queue whose every job is number 1, inserted nowhere.
type jobOne struct{}

func (jobOne) Enqueue(context.Context, pgx.Tx, txhook.Event) (int64, error) { return 1, nil }
