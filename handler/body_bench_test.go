package handler_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
)

// filler is a request body of n bytes that costs no memory to send: the
// memory measured is the endpoint's. Before its last byte it waits until
// every body of the round has reached its last byte, so that all of them
// are held at once, as with slow senders.
type filler struct {
	n     int64
	round *sync.WaitGroup
	held  bool
}

func (f *filler) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, io.EOF
	}
	if f.n == 1 && !f.held {
		f.held = true
		f.round.Done()
		f.round.Wait()
	}
	k := min(int64(len(p)), f.n-1)
	if f.held {
		k = 1
	}
	for i := range p[:k] {
		p[i] = 'x'
	}
	f.n -= k
	return int(k), nil
}

// BenchmarkUnsignedBodies sends 100 concurrent unsigned bodies of the
// largest size each provider's endpoint accepts by default, with and without
// a Content-Length, and reports the peak of live heap objects while they are
// read and rejected ("peak-heap-MiB"), what was allocated ("alloc-MiB/op"),
// and the process's peak resident set during the run ("peak-rss-MiB", from
// /proc). Every answer must be 400: the signature is checked after the
// whole body is read. Run it alone:
//
//	go test -run '^$' -bench BenchmarkUnsignedBodies -benchtime 1x ./handler
func BenchmarkUnsignedBodies(b *testing.B) {
	const concurrent = 100
	for _, tc := range []struct {
		name  string
		p     handler.Provider
		limit int64
	}{
		{"github", &handler.GitHub{Secrets: []string{"gh"}}, 25 << 20},
		{"shopify", &handler.Shopify{Secrets: []string{"shp"}}, 4 << 20},
		{"stripe", &handler.Stripe{Secrets: []string{"whsec_x"}}, handler.DefaultMaxBodyBytes},
		{"standard", &handler.StandardWebhooks{Secrets: []string{"whsec_c2VjcmV0LTE="}}, handler.DefaultMaxBodyBytes},
	} {
		for _, declared := range []bool{true, false} {
			name := tc.name
			if !declared {
				name += "/chunked"
			}
			b.Run(name, func(b *testing.B) {
				proc, err := txhook.NewProcessor(noDB{}, fallbackOnly("s"))
				if err != nil {
					b.Fatal(err)
				}
				ep, err := handler.New(proc, &handler.Config{Source: "s", Provider: tc.p, BodyDedupe: handler.BodyDedupeOff,
					Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
				if err != nil {
					b.Fatal(err)
				}
				var peak atomic.Uint64
				samples := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/gc/heap/allocs:bytes"}}
				debug.FreeOSMemory()
				resetPeakRSS()
				metrics.Read(samples)
				allocStart := samples[1].Value.Uint64()
				stop := make(chan struct{})
				sampled := make(chan struct{})
				go func() {
					defer close(sampled)
					s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
					t := time.NewTicker(time.Millisecond)
					defer t.Stop()
					for {
						metrics.Read(s)
						if v := s[0].Value.Uint64(); v > peak.Load() {
							peak.Store(v)
						}
						select {
						case <-stop:
							return
						case <-t.C:
						}
					}
				}()
				b.ResetTimer()
				for range b.N {
					var wg, round sync.WaitGroup
					round.Add(concurrent)
					for range concurrent {
						wg.Go(func() {
							req := httptest.NewRequest(http.MethodPost, "/", &filler{n: tc.limit, round: &round})
							req.ContentLength = -1
							if declared {
								req.ContentLength = tc.limit
							}
							req.Header.Set("X-GitHub-Delivery", "d")
							req.Header.Set("X-GitHub-Event", "push")
							w := httptest.NewRecorder()
							ep.ServeHTTP(w, req)
							if w.Code != http.StatusBadRequest {
								b.Errorf("status %d, want 400", w.Code)
							}
						})
					}
					wg.Wait()
				}
				b.StopTimer()
				close(stop)
				<-sampled
				metrics.Read(samples)
				b.ReportMetric(float64(peak.Load())/(1<<20), "peak-heap-MiB")
				b.ReportMetric(float64(samples[1].Value.Uint64()-allocStart)/(1<<20)/float64(b.N), "alloc-MiB/op")
				b.ReportMetric(float64(peakRSS())/(1<<20), "peak-rss-MiB")
			})
		}
	}
}

// resetPeakRSS starts a new peak for peakRSS, where Linux allows it.
func resetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

// peakRSS returns the process's peak resident set size (VmHWM), or 0 where
// /proc is not available.
func peakRSS() int64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(raw)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}
