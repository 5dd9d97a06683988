package txhook

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/txhook/txhook/db"
)

// A delivery normally costs its transaction's round trips: BEGIN with the
// dedupe step, the handler's statements, COMMIT; a duplicate, BEGIN with the
// dedupe step and ROLLBACK. When a provider redelivers in bulk (after an
// outage, or when acknowledgements were lost) most deliveries are duplicates,
// and a plain read of the key before any transaction answers each of them in
// one round trip, at the price of one more for each new event. Per delivery
// that is 5 - 4f round trips against 4 - 2f without the read, for a share f
// of duplicates: the read pays when f is over one half. The Processor keeps
// an estimate of f and reads first while it is.

// dupShare estimates the share of a Processor's recent deliveries that were
// duplicates: an exponentially weighted average in which the newest delivery
// weighs 1/16, in units of 1/dupShareOne. Safe for concurrent use.
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

// direct returns d as a database that runs statements on their own,
// outside any transaction: a pool, a connection, or a wrapper that also has
// pgx's Exec, Query and QueryRow. It returns nil for a Beginner that only
// begins transactions.
func direct(d Beginner) db.DBTX {
	r, _ := d.(db.DBTX)
	return r
}

// settled reports whether ev's key is already done or failed, with one read
// outside any transaction. A false answer decides nothing: the transaction's
// dedupe step does.
func (p *Processor) settled(ctx context.Context, ev Event) (bool, error) {
	ok, err := db.New(p.direct).EventSettled(ctx, db.EventSettledParams{Source: ev.Source, EventKey: ev.Key})
	if err != nil {
		return false, fmt.Errorf("look up event key: %w", err)
	}
	return ok, nil
}
