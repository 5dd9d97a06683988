package console

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/txhook/txhook/admin"
	"github.com/txhook/txhook/internal/testdb"
)

// BenchmarkPagesMillionRows serves each console page from an events table of
// one million rows (980,000 done over the last 30 days, 10,000 failed, 10,000
// in progress, three sources) and reports the time per page. It builds the
// table first and runs only when asked for:
//
//	TEST_DATABASE_URL=postgres://... go test -run '^$' -bench PagesMillionRows ./console
func BenchmarkPagesMillionRows(b *testing.B) {
	d := testdb.New(b)
	start := time.Now()
	if _, err := d.Pool.Exec(b.Context(), `
		INSERT INTO txhook_processed_events
			(source, event_key, event_type, status, attempts, created_at, claimed_at, completed_at,
			 lease_expires_at, last_error, payload)
		SELECT (ARRAY['stripe', 'github', 'shopify'])[1 + g % 3],
		       'evt_' || lpad(g::text, 24, '0'),
		       (ARRAY['invoice.paid', 'invoice.created', 'checkout.session.completed', 'push'])[1 + g % 4],
		       s.status, 1, t.at, t.at,
		       CASE WHEN s.status <> 'in_progress' THEN t.at + interval '30 milliseconds' END,
		       CASE WHEN s.status = 'in_progress' THEN now() + interval '5 minutes' END,
		       CASE WHEN s.status = 'failed' THEN 'permanent: no such customer' END,
		       CASE WHEN s.status = 'failed' THEN convert_to('{"id":"evt_' || g || '"}', 'UTF8') END
		FROM generate_series(1, 1000000) AS g,
		LATERAL (SELECT CASE WHEN g <= 980000 THEN 'done' WHEN g <= 990000 THEN 'failed'
		                     ELSE 'in_progress' END AS status) AS s,
		LATERAL (SELECT now() - (g::bigint * 7919 % 2592000) * interval '1 second' AS at) AS t`); err != nil {
		b.Fatal(err)
	}
	if _, err := d.Pool.Exec(b.Context(), "VACUUM ANALYZE txhook_processed_events"); err != nil {
		b.Fatal(err)
	}
	b.Logf("seeded 1,000,000 rows in %v", time.Since(start).Round(time.Millisecond))

	srv := httptest.NewServer(http.StripPrefix("/txhook", newConsole(b, d.Pool, &admin.Config{AllowWrites: true})))
	b.Cleanup(srv.Close)
	deep := url.Values{"before_at": {time.Now().Add(-25 * 24 * time.Hour).UTC().Format(time.RFC3339Nano)}, "before_source": {"stripe"}, "before_key": {"evt_"}}
	pages := []struct{ name, path string }{
		{"overview", "/txhook/"},
		{"events", "/txhook/events"},
		{"events-25-days-back", "/txhook/events?" + deep.Encode()},
		{"events-github-push-7d", "/txhook/events?source=github&type=push&since=7d"},
		{"events-in-progress", "/txhook/events?status=in_progress"},
		{"dead-letters", "/txhook/dead-letters"},
		{"dead-letters-shopify", "/txhook/dead-letters?source=shopify"},
		{"event", "/txhook/event?source=shopify&key=evt_000000000000000000985001"},
	}
	for _, p := range pages {
		b.Run(p.name, func(b *testing.B) {
			for b.Loop() {
				resp, err := http.Get(srv.URL + p.path)
				if err != nil {
					b.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("%s: %d\n%s", p.path, resp.StatusCode, body)
				}
			}
		})
	}
}

// BenchmarkLargePayload serves the event page and the download of a payload
// of 25 MiB (GitHub's limit) and reports, per view, the time, the bytes the
// process allocated and the size of the answer:
//
//	TEST_DATABASE_URL=postgres://... go test -run '^$' -bench LargePayload ./console
func BenchmarkLargePayload(b *testing.B) {
	d := testdb.New(b)
	storeLargePayload(b, d.Pool)
	srv := httptest.NewServer(http.StripPrefix("/txhook", newConsole(b, d.Pool, nil)))
	b.Cleanup(srv.Close)
	for _, p := range []struct{ name, path string }{
		{"event-page", "/txhook/event?source=github&key=big-1"},
		{"download", "/txhook/payload?source=github&key=big-1"},
	} {
		b.Run(p.name, func(b *testing.B) {
			b.ReportAllocs()
			var size int64
			for b.Loop() {
				resp, err := http.Get(srv.URL + p.path)
				if err != nil {
					b.Fatal(err)
				}
				size, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK {
					b.Fatalf("%s: %d, %v", p.path, resp.StatusCode, err)
				}
			}
			b.ReportMetric(float64(size), "answer-bytes")
		})
	}
}
