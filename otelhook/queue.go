package otelhook

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/txhook/txhook"
)

// ObserveQueue registers two gauges of inbox mode's queue, read from q
// (usually the *pgxpool.Pool) at each collection with
// txhook.ReadQueueStats, through mp (nil: the global MeterProvider):
//
//	txhook.inbox.queued             events accepted and not yet applied
//	txhook.inbox.oldest_queued_age  seconds since the oldest of them was accepted (0 when none)
//
// A failed read records nothing for that collection. Unregister the
// returned registration to stop.
func ObserveQueue(mp metric.MeterProvider, q txhook.Querier) (metric.Registration, error) {
	if q == nil {
		return nil, fmt.Errorf("observe queue: nil querier")
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(ScopeName)
	queued, err := m.Int64ObservableGauge("txhook.inbox.queued",
		metric.WithDescription("Events accepted in inbox mode and not yet applied."),
		metric.WithUnit("{event}"))
	if err != nil {
		return nil, fmt.Errorf("create queued gauge: %w", err)
	}
	age, err := m.Float64ObservableGauge("txhook.inbox.oldest_queued_age",
		metric.WithDescription("Time since the oldest event queued in inbox mode was accepted."),
		metric.WithUnit("s"))
	if err != nil {
		return nil, fmt.Errorf("create oldest queued age gauge: %w", err)
	}
	reg, err := m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		s, err := txhook.ReadQueueStats(ctx, q)
		if err != nil {
			return err
		}
		attrs := metric.WithAttributeSet(attribute.NewSet())
		o.ObserveInt64(queued, s.Queued, attrs)
		o.ObserveFloat64(age, s.OldestAge.Seconds(), attrs)
		return nil
	}, queued, age)
	if err != nil {
		return nil, fmt.Errorf("register queue callback: %w", err)
	}
	return reg, nil
}
