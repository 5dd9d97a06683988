package txhook

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook/db"
	"github.com/txhook/txhook/internal/engine"
)

// Defaults of Config.RecentKeys and Config.RecentKeysTTL.
const (
	DefaultRecentKeys    = 10000
	DefaultRecentKeysTTL = 10 * time.Minute
)

// dupFilter is Process's duplicate shortcut: it answers a redelivery of a
// key settled as done before any transaction, from memory or with one read.
// It learns only from answers the database gave:
//
//   - the memory holds keys this Processor saw committed as done (processed
//     by it, or read as done); a failed key is never remembered, since an
//     operator may replay it;
//   - the share of recent deliveries that the database answered as
//     duplicates decides whether to read first. A delivery normally costs its
//     transaction's round trips: BEGIN with the dedupe step, the handler's
//     statements, COMMIT; a duplicate, BEGIN with the dedupe step, ROLLBACK
//     and the read of a claim holding its key. Reading the key's status
//     first answers a duplicate in one round trip at the price of one more
//     for each new event: per delivery 5 - 4f round trips against 4 - f
//     without the read, for a share f of duplicates. The read pays when f is
//     over a third; it starts over one half, where it pays whatever the
//     handler's own round trips. Deliveries the memory answers reach no
//     database and are not counted.
//
// The read goes through the engine (engine.Exec) on read, the Processor's
// database; a nil read turns it off (a Beginner that only begins
// transactions, on which it would cost a transaction). A nil memory
// remembers nothing.
type dupFilter struct {
	read   engine.Querier
	share  dupShare
	memory *recentKeys
}

// answer returns the duplicate outcome and true when the filter knows ev's
// key is done. An error comes from the read.
func (f *dupFilter) answer(ctx context.Context, ev Event) (Result, bool, error) {
	if f.memory.done(ev) {
		return Result{Outcome: OutcomeDuplicate}, true, nil
	}
	if f.read == nil || !f.share.mostly() {
		return Result{}, false, nil
	}
	var status string
	err := engine.Exec(ctx, f.read, func(ctx context.Context, q engine.Querier) error {
		var err error
		status, err = db.New(q).EventStatus(ctx, db.EventStatusParams{Source: ev.Source, EventKey: ev.Key})
		return err
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Result{}, false, nil
	case err != nil:
		return Result{}, true, fmt.Errorf("look up event key: %w", err)
	case status == statusInProgress:
		return Result{}, false, nil // the transaction's dedupe step answers
	}
	f.share.observe(true)
	if status == statusDone {
		f.memory.remember(ev)
	}
	return Result{Outcome: OutcomeDuplicate}, true, nil
}

// learn records what the database answered for ev.
func (f *dupFilter) learn(ev Event, res Result, err error) {
	if err != nil || res.Outcome == OutcomeInFlight {
		return
	}
	f.share.observe(res.Outcome == OutcomeDuplicate)
	if res.Outcome == OutcomeProcessed {
		f.memory.remember(ev)
	}
}

// dupShare estimates the share of recent deliveries that the database
// answered as duplicates: an exponentially weighted average in which the
// newest delivery weighs 1/16, in units of 1/dupShareOne. Safe for
// concurrent use.
type dupShare struct{ v atomic.Uint32 }

const (
	dupShareOne   = 1 << 16
	dupShareShift = 4 // the newest delivery weighs 1/2^4
)

// observe adds one delivery, a duplicate or not.
func (s *dupShare) observe(dup bool) {
	for {
		old := s.v.Load()
		v := old - old>>dupShareShift
		if dup {
			v = old + (dupShareOne-old)>>dupShareShift
		}
		if v == old || s.v.CompareAndSwap(old, v) {
			return
		}
	}
}

// mostly reports whether more than half of the recent deliveries were
// duplicates.
func (s *dupShare) mostly() bool { return s.v.Load() > dupShareOne/2 }

// recentKeys remembers, for a bounded time, keys settled as done. A done key
// never changes while its row exists, and rows are pruned only after the
// events table's retention, far past the TTL. It holds at most len(ring)
// keys, evicting the oldest first. A nil *recentKeys remembers nothing.
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

// done reports whether ev's key was remembered less than the TTL ago.
func (r *recentKeys) done(ev Event) bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.at[recentKey{ev.Source, ev.Key}]
	return ok && time.Since(t) < r.ttl
}

// ForgetRecentKeys empties p's memory of done keys (Config.RecentKeys): the
// next delivery of every key reaches the database. Call it after deleting
// event rows by hand to have their events processed again, which p would
// otherwise answer as duplicates until RecentKeysTTL has passed; the
// duplicate check of package txhooktest calls it before each delivery.
func (p *Processor) ForgetRecentKeys() { p.filter.memory.forget() }

// forget empties the memory.
func (r *recentKeys) forget() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.at)
	clear(r.ring)
	r.next = 0
}

// remember records that ev's key is done, as of now.
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
