package txhook

import (
	"sync"
	"time"
)

// Defaults of Config.RecentKeys and Config.RecentKeysTTL.
const (
	DefaultRecentKeys    = 10000
	DefaultRecentKeysTTL = 10 * time.Minute
)

// recentKeys remembers, for a bounded time, keys a Processor saw settled
// (committed as done or failed), so that Process answers a redelivery of
// one without a round trip. A settled key never becomes new again while
// its row exists, and rows are pruned only after the events table's
// retention, far past the TTL. It holds at most len(ring) keys, evicting the
// oldest first. A nil *recentKeys remembers nothing.
type recentKeys struct {
	ttl time.Duration

	mu   sync.Mutex
	at   map[recentKey]time.Time // when each key was remembered
	ring []recentKey             // the keys, in the order remembered
	next int                     // the ring's slot to fill next
}

type recentKey struct{ source, key string }

// newRecentKeys returns a memory of n keys, or nil when n <= 0.
func newRecentKeys(n int, ttl time.Duration) *recentKeys {
	if n <= 0 {
		return nil
	}
	return &recentKeys{ttl: ttl, at: make(map[recentKey]time.Time, n), ring: make([]recentKey, n)}
}

// settled reports whether ev's key was remembered less than the TTL ago.
func (r *recentKeys) settled(ev Event) bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.at[recentKey{ev.Source, ev.Key}]
	return ok && time.Since(t) < r.ttl
}

// remember records that ev's key is settled, as of now.
func (r *recentKeys) remember(ev Event) {
	if r == nil {
		return
	}
	now := time.Now()
	k := recentKey{ev.Source, ev.Key}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.at[k]; ok {
		r.at[k] = now
		return
	}
	if old := r.ring[r.next]; old != (recentKey{}) {
		delete(r.at, old)
	}
	r.ring[r.next] = k
	r.at[k] = now
	r.next = (r.next + 1) % len(r.ring)
}
