// Package otelhook reports webhook deliveries received by the handler
// package as OpenTelemetry metrics. It is its own module so that txhook's
// core module does not depend on OpenTelemetry.
//
//	obs, err := otelhook.New(nil) // the global MeterProvider
//	if err != nil { ... }
//	ep, err := handler.New(proc, &handler.Config{..., Observer: obs})
//
// Two instruments are recorded per delivery, both with the attributes
// txhook.source, txhook.outcome (handler.Answer) and, for webhooks,
// http.response.status_code (a broker message, from the queue consumers,
// has none):
//
//	txhook.handler.deliveries   counter of deliveries
//	txhook.handler.duration     histogram of the time to answer, in seconds
//
// The event key and type are not attributes: keys are unbounded, and types
// are chosen by the sender.
package otelhook

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/txhook/txhook/handler"
)

// ScopeName is the instrumentation scope of the meter.
const ScopeName = "github.com/txhook/txhook/otelhook"

// Observer implements handler.Observer with OpenTelemetry instruments. It is
// safe for concurrent use.
type Observer struct {
	deliveries metric.Int64Counter
	duration   metric.Float64Histogram
}

var _ handler.Observer = (*Observer)(nil)

// New returns an Observer recording through mp; nil means the global
// MeterProvider (otel.GetMeterProvider).
func New(mp metric.MeterProvider) (*Observer, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(ScopeName)
	deliveries, err := m.Int64Counter("txhook.handler.deliveries",
		metric.WithDescription("Webhook deliveries answered, by source, outcome and status."),
		metric.WithUnit("{delivery}"))
	if err != nil {
		return nil, fmt.Errorf("create deliveries counter: %w", err)
	}
	duration, err := m.Float64Histogram("txhook.handler.duration",
		metric.WithDescription("Time from receiving a webhook delivery to answering it."),
		metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
	if err != nil {
		return nil, fmt.Errorf("create duration histogram: %w", err)
	}
	return &Observer{deliveries: deliveries, duration: duration}, nil
}

// ObserveDelivery records r.
func (o *Observer) ObserveDelivery(ctx context.Context, r handler.Report) {
	kv := []attribute.KeyValue{
		attribute.String("txhook.source", r.Source),
		attribute.String("txhook.outcome", string(r.Answer)),
	}
	if r.Status != 0 {
		kv = append(kv, attribute.Int("http.response.status_code", r.Status))
	}
	attrs := metric.WithAttributeSet(attribute.NewSet(kv...))
	o.deliveries.Add(ctx, 1, attrs)
	o.duration.Record(ctx, r.Duration.Seconds(), attrs)
}
