package engine

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// savepointTx is a savepoint in the caller's transaction (ProcessTx,
// RunTx), or in an engine transaction (a body's tx.Begin). SAVEPOINT
// is a round trip of its own, before the first batch, so that nothing in
// that batch can fail before the savepoint exists; RELEASE SAVEPOINT
// travels with the deferred statements.
//
// Its routing: SAVEPOINT goes through parent, after what parent had
// deferred until then; the savepoint's later statements go past what the
// engine transactions around it defer (see enclosing), which stays theirs.
type savepointTx struct {
	Tx
	parent pgx.Tx // the transaction the savepoint is in
	depth  int    // how many savepoints enclose this one, plus one
	saved  bool   // SAVEPOINT succeeded
}

// newSavepoint returns a savepoint in parent, a run's own when run is set.
func newSavepoint(parent pgx.Tx, first firstStep, run bool) *Tx {
	s := &savepointTx{parent: parent, depth: depthIn(parent)}
	s.Tx = Tx{s: s, run: run, first: first}
	return &s.Tx
}

// depthIn is the depth of a savepoint begun in parent: one more than
// parent's own when parent is a savepoint of the engine's, and 1 otherwise.
func depthIn(parent pgx.Tx) int {
	if p, ok := parent.(*Tx); ok {
		if s, ok := p.s.(*savepointTx); ok {
			return s.depth + 1
		}
	}
	return 1
}

// config is Tx.Config: the configuration the transaction the savepoint is
// in tells, if it tells one.
func (s *savepointTx) config() *pgxpool.Config {
	if p, ok := s.parent.(interface{ Config() *pgxpool.Config }); ok {
		return p.Config()
	}
	return nil
}

// name is the name of the savepoint: unique among the savepoints that
// enclose it, so that ROLLBACK TO and RELEASE, which act on the newest
// savepoint of a name, find this one and not one its body left open.
func (s *savepointTx) name() string {
	return "txhook_" + strconv.Itoa(s.depth)
}

// sendBegin is Tx.sendBegin: SAVEPOINT in a round trip of its own,
// then the batch of what queue adds, whose results are all the caller's to
// read. pgx may send a batch's statements to be prepared before the batch
// itself, and a statement the server refuses then aborts the caller's
// transaction: the savepoint must exist by then for the run to roll back
// to it.
func (s *savepointTx) sendBegin(ctx context.Context, queue func(b *pgx.Batch)) (pgx.BatchResults, bool, error) {
	// SAVEPOINT goes through the caller's transaction, after what it had
	// deferred; the savepoint's own statements go past what it defers
	// from now on (see enclosing).
	s.under = s.parent
	if _, err := s.parent.Exec(ctx, "savepoint "+s.name()); err != nil {
		return nil, s.connClosed(), err
	}
	s.saved = true
	s.under = s.enclosing()
	b := &pgx.Batch{}
	queue(b)
	return s.under.SendBatch(ctx, b), false, nil
}

// enclosing is the transaction a savepoint's own statements go to once
// SAVEPOINT has been sent: the caller's transaction or, when that is the
// engine's, the transaction under it. They go past what the enclosing
// engine transactions deferred: a statement belongs to the transaction it
// was deferred on, and waits for that transaction's next statement.
func (s *savepointTx) enclosing() pgx.Tx {
	q := s.parent
	for {
		p, ok := q.(*Tx)
		if !ok || p.under == nil {
			return q
		}
		q = p.under
	}
}

// commit implements strategy: the deferred statements travel with RELEASE
// SAVEPOINT in one batch, under bctx. A savepoint commits nothing: its
// errors are returned as they are.
func (s *savepointTx) commit(bctx, cctx context.Context) error {
	if ended, err := s.commitStart(bctx, cctx); ended {
		return err
	}
	stmts := s.queue
	s.queue = nil
	br := s.under.SendBatch(bctx, batchOf(stmts, "release savepoint "+s.name()))
	failed := readAll(br, stmts)
	var err error
	if failed < 0 {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil && failed < 0 {
		err = cerr
	}
	if failed >= 0 {
		err = &DeferredError{Err: stmts[failed].err}
	}
	if err != nil {
		return s.abortWith(cctx, 0, err)
	}
	s.end()
	return nil
}

// rollback implements strategy. Its error leaves the caller's transaction
// in a state nobody knows (see unusableError).
func (s *savepointTx) rollback(ctx context.Context) error {
	defer s.end()
	if !s.saved {
		return nil // SAVEPOINT failed: there is nothing of this savepoint to roll back
	}
	// Without arguments, pgx sends this with the simple protocol, which
	// an aborted transaction accepts (a batch would first prepare it, and
	// refuse its two commands). It goes past what the enclosing engine
	// transactions deferred: that is theirs, and waits for their next
	// statement.
	name := s.name()
	if _, err := s.enclosing().Exec(ctx, "rollback to savepoint "+name+"; release savepoint "+name); err != nil {
		return fmt.Errorf("rollback to savepoint %s: %w", name, err)
	}
	return nil
}

// release implements strategy: the connection is the caller's.
func (s *savepointTx) release() {}

// outerErr implements strategy: the savepoint's statements go past the
// engine transaction it is in (see enclosing), but not once that has
// failed or ended; and a statement that ended the transaction under the
// savepoint ended the caller's.
func (s *savepointTx) outerErr() error {
	if p, ok := s.parent.(*Tx); ok {
		if err := p.err(); err != nil {
			return err
		}
	}
	if s.ended() {
		return errCallerTxEnded
	}
	return nil
}
