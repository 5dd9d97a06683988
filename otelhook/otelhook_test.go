package otelhook_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
	"github.com/txhook/txhook/otelhook"
)

func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != otelhook.ScopeName {
			t.Errorf("scope %q", sm.Scope.Name)
		}
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

func TestObserver(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	obs, err := otelhook.New(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []handler.Report{
		{Source: "stripe", Key: "evt_1", Answer: handler.AnswerProcessed, Status: 200, Duration: 20 * time.Millisecond},
		{Source: "stripe", Key: "evt_1", Answer: handler.AnswerDuplicate, Status: 200, Duration: 3 * time.Millisecond},
		{Source: "stripe", Key: "evt_2", Answer: handler.AnswerProcessed, Status: 200, Duration: 2 * time.Second},
		{Source: "github", Answer: handler.AnswerBadSignature, Status: 400, Duration: time.Millisecond},
		{Source: "orders", Key: "m1", Answer: handler.AnswerProcessed, Duration: time.Millisecond}, // a broker message
	} {
		obs.ObserveDelivery(t.Context(), r)
	}
	got := collect(t, reader)

	sum, ok := got["txhook.handler.deliveries"].(metricdata.Sum[int64])
	if !ok || !sum.IsMonotonic {
		t.Fatalf("deliveries = %#v, want a monotonic int64 sum", got["txhook.handler.deliveries"])
	}
	counts := map[string]int64{}
	for _, dp := range sum.DataPoints {
		src, _ := dp.Attributes.Value("txhook.source")
		out, _ := dp.Attributes.Value("txhook.outcome")
		code, hasCode := dp.Attributes.Value("http.response.status_code")
		if !hasCode {
			counts[src.AsString()+"/"+out.AsString()+"/none"] = dp.Value
			continue
		}
		counts[src.AsString()+"/"+out.AsString()+"/"+code.String()] = dp.Value
		if dp.Attributes.HasValue(attribute.Key("txhook.key")) {
			t.Error("event key recorded as an attribute")
		}
	}
	want := map[string]int64{"stripe/processed/200": 2, "stripe/duplicate/200": 1, "github/bad_signature/400": 1, "orders/processed/none": 1}
	for k, v := range want {
		if counts[k] != v {
			t.Errorf("count %s = %d, want %d (all: %v)", k, counts[k], v, counts)
		}
	}
	if len(counts) != len(want) {
		t.Errorf("series %v, want %v", counts, want)
	}

	hist, ok := got["txhook.handler.duration"].(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("duration = %#v, want a float64 histogram", got["txhook.handler.duration"])
	}
	for _, dp := range hist.DataPoints {
		out, _ := dp.Attributes.Value("txhook.outcome")
		src, _ := dp.Attributes.Value("txhook.source")
		if src.AsString() == "stripe" && out.AsString() == "processed" {
			if dp.Count != 2 || dp.Sum < 2.019 || dp.Sum > 2.021 {
				t.Errorf("processed histogram count %d sum %v, want 2 and 2.02", dp.Count, dp.Sum)
			}
		}
	}
}

// TestObserverOnEndpoint wires the observer into an endpoint: a rejected
// delivery (no database needed) is counted.
func TestObserverOnEndpoint(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	obs, err := otelhook.New(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	routes := txhook.NewRoutes()
	routes.Transactional("stripe", "", func(context.Context, pgx.Tx, txhook.Event) error { return nil })
	proc, err := txhook.NewProcessor(noDB{}, &txhook.Config{Routes: routes})
	if err != nil {
		t.Fatal(err)
	}
	ep, err := handler.New(proc, &handler.Config{
		Source:   "stripe",
		Provider: &handler.Stripe{Secrets: []string{"whsec_x"}},
		Observer: obs,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(ep)
	defer srv.Close()
	resp, err := srv.Client().Post(srv.URL, "application/json", strings.NewReader(`{"id":"evt_1"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d", resp.StatusCode)
	}
	sum := collect(t, reader)["txhook.handler.deliveries"].(metricdata.Sum[int64])
	if len(sum.DataPoints) != 1 || sum.DataPoints[0].Value != 1 {
		t.Fatalf("data points %+v", sum.DataPoints)
	}
	out, _ := sum.DataPoints[0].Attributes.Value("txhook.outcome")
	if out.AsString() != string(handler.AnswerBadSignature) {
		t.Errorf("outcome %q", out.AsString())
	}
}

type noDB struct{}

func (noDB) BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error) {
	return nil, context.Canceled
}
