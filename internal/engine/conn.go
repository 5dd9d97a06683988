package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// connTx is a transaction on a pool or a connection: BEGIN travels in the
// first batch, and COMMIT with the deferred statements. On a pool it holds
// the connection it acquired from the first batch to its end.
type connTx struct {
	Tx
	db     Beginner // a *pgxpool.Pool, *pgxpool.Conn or *pgx.Conn
	opts   pgx.TxOptions
	pooled *pgxpool.Conn // the connection acquired from a pool; released at the end
}

// sendBegin is Tx.sendBegin. When the batch fails to begin, a pooled
// connection goes back (or, closed, out of the pool), and a session the
// server had ended before the batch is replaced once: nothing of the batch
// ran on it, so it is sent again on another connection. A statement pgx
// refused is not sent again.
func (c *connTx) sendBegin(ctx context.Context, queue func(b *pgx.Batch)) (pgx.BatchResults, bool, error) {
	_, fromPool := c.db.(*pgxpool.Pool)
	for try := 0; ; try++ {
		b := &pgx.Batch{}
		b.BeginTx(c.opts)
		queue(b)
		br, err := c.sendBatch(ctx, b)
		if err == nil {
			if _, err = br.Exec(); err == nil { // BEGIN
				return br, false, nil
			}
			br.Close()
		}
		closed := c.connClosed()
		if c.pooled != nil {
			// The transaction never began: its connection goes back now.
			c.release()
			c.under = nil
		}
		if try == 0 && !statementRefused(err) && (pgconn.SafeToRetry(err) || (closed && fromPool)) {
			continue
		}
		return nil, closed, err
	}
}

// statementRefused reports whether pgx refused a batch for one of its
// statements (a statement the server could not prepare, arguments that
// could not be encoded) rather than for its connection: sent again, the
// batch would be refused again.
func statementRefused(err error) bool {
	_, ok := errors.AsType[pgx.ErrPreprocessingBatch](err)
	return ok && !Unreachable(err)
}

// sendBatch sends b, the first batch, on the connection the transaction
// runs on.
func (c *connTx) sendBatch(ctx context.Context, b *pgx.Batch) (pgx.BatchResults, error) {
	conn, err := c.acquire(ctx)
	if err != nil {
		return nil, err
	}
	br := conn.SendBatch(ctx, b)
	c.under = br.Tx()
	return br, nil
}

// acquire returns the connection the transaction runs on: on a pool, the
// one it holds, or one it acquires.
func (c *connTx) acquire(ctx context.Context) (*pgx.Conn, error) {
	if c.pooled != nil {
		return c.pooled.Conn(), nil
	}
	switch d := c.db.(type) {
	case *pgxpool.Pool:
		pc, err := d.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		c.pooled = pc
		return pc.Conn(), nil
	case *pgxpool.Conn:
		return d.Conn(), nil
	case *pgx.Conn:
		return d, nil
	}
	return nil, errors.New("txhook: no connection to begin a batch on")
}

// config is Tx.Config: the pool's configuration, or the connection's.
func (c *connTx) config() *pgxpool.Config {
	if p, ok := c.db.(*pgxpool.Pool); ok {
		return p.Config()
	}
	conn, err := c.acquire(context.Background()) // a connection: acquire sends nothing
	if err != nil {
		return nil
	}
	return &pgxpool.Config{ConnConfig: conn.Config()}
}

// commit implements strategy: the deferred statements travel with COMMIT in
// one batch, under cctx (deferred statements that begin the transaction,
// when nothing else was sent, go under bctx).
func (c *connTx) commit(bctx, cctx context.Context) error {
	if c.first.fn != nil {
		return c.commitWithFirst(bctx, cctx)
	}
	if ended, err := c.commitStart(bctx, cctx); ended {
		return commitError(err)
	}
	defer c.end()
	if len(c.queue) == 0 {
		return commitError(c.under.Commit(cctx))
	}
	return commitError(c.commitQueued(cctx))
}

// commitQueued sends the deferred statements and COMMIT in one batch.
func (c *connTx) commitQueued(ctx context.Context) error {
	stmts := c.queue
	c.queue = nil
	br := c.under.Conn().SendBatch(ctx, batchOf(stmts, "commit"))
	var err error
	var tag pgconn.CommandTag
	if failed := readAll(br, stmts); failed >= 0 {
		err = &DeferredError{Err: stmts[failed].err}
	} else {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return c.settle(ctx, err, tag)
}

// settle says what a batch that ended with COMMIT did, from the first
// error its statements got (err) and COMMIT's tag, and rolls back a
// transaction COMMIT left open: nil (committed), a *rolledBackError, a
// *CommitUnknownError, or COMMIT's own error (the server rolled back).
func (c *connTx) settle(ctx context.Context, err error, tag pgconn.CommandTag) error {
	conn := c.under.Conn()
	switch {
	case conn.IsClosed() && err != nil:
		if serverError(err) {
			// The server answered a statement with an error, which
			// aborted the transaction before COMMIT; the connection
			// closed after that.
			return &rolledBackError{err: err}
		}
		// The connection failed while the batch was sent or its answers
		// read (the first statement's read then carries the error):
		// COMMIT may have been applied.
		return &CommitUnknownError{Err: err}
	case conn.IsClosed():
		// COMMIT answered; the connection closed after that.
	case conn.PgConn().TxStatus() != 'I':
		// COMMIT did not run: a statement before it failed, or the batch
		// could not be sent. The transaction is still open: roll it back.
		if rerr := c.under.Rollback(ctx); rerr != nil {
			return errors.Join(err, rerr) // the connection is closed: unknown
		}
		if err == nil {
			err = errors.New("txhook: commit was not applied")
		}
		return &rolledBackError{err: err}
	case err != nil:
		return err // COMMIT's own error: the server rolled back
	}
	if tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return nil
}

// commitWithFirst sends the whole run in one round trip, when the body sent
// nothing but deferred statements and the first step's statement aborts
// the transaction whenever it stops the run (Spec.FirstAborts): BEGIN, that
// statement, the deferred statements and COMMIT. A stop, or a failed
// deferred statement, makes the server skip what follows, COMMIT
// included. The connection is acquired under bctx, as a first batch's is;
// the batch carries COMMIT, so it is sent under cctx.
//
// A pooled session found ended when BEGIN is read is replaced and the
// batch sent again, as any first batch (see sendBegin): should the first
// try have committed after all, the first step of the second stops it.
func (c *connTx) commitWithFirst(bctx, cctx context.Context) error {
	if _, err := c.acquire(bctx); err != nil {
		c.end()
		return &beginError{err: err}
	}
	stmts, n := append(c.queue, stmt{sql: "commit"}), len(c.queue)
	c.queue = nil
	c.begin(cctx, stmts, n)
	if err := c.beginErr; err != nil {
		lost := c.connClosed()
		if _, refused := errors.AsType[pgx.ErrPreprocessingBatch](err); (refused || serverError(err)) && !lost {
			// pgx refused the batch before sending it, or the server
			// refused BEGIN: nothing ran.
			_ = c.abort(cctx, 0)
			return err
		}
		// The connection failed once the batch was handed to it: COMMIT
		// may have run. (pgx reports a connection lost while the
		// answers are read as one closed before the batch, "safe to
		// retry": that cannot tell.)
		c.endWith(lost)
		return &CommitUnknownError{Err: err}
	}
	defer c.end()
	err := c.firstErr
	for _, s := range stmts[:n] {
		if err == nil && s.err != nil {
			err = &DeferredError{Err: s.err}
		}
	}
	if err == nil {
		err = stmts[n].err
	}
	res := c.settle(cctx, err, stmts[n].tag)
	if c.firstErr == nil {
		return commitError(res)
	}
	// The first step stopped the run. Its statement failed, so the server
	// skipped COMMIT (which then carries that failure), unless the
	// connection was lost after sending.
	if stmts[n].err == nil {
		return fmt.Errorf("txhook: the first step stopped the run although its statement succeeded, and COMMIT ran (%v)", c.firstErr)
	}
	if _, ok := errors.AsType[*CommitUnknownError](res); ok {
		return res
	}
	return c.firstErr // as the first step asked
}

// serverError reports whether err carries the server's answer to a
// statement: an ERROR, which aborts the transaction it ran in.
func serverError(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && pgErr.Severity == "ERROR"
}

// rollback implements strategy. A failed rollback leaves nothing to do:
// pgx closes the connection, and the server rolls back what it had open
// (pgx.ErrTxClosed: BEGIN failed, nothing to roll back).
func (c *connTx) rollback(ctx context.Context) error {
	_ = c.under.Rollback(ctx)
	c.end()
	return nil
}

// release implements strategy.
func (c *connTx) release() {
	if c.pooled != nil {
		c.pooled.Release()
		c.pooled = nil
	}
}

// outerErr implements strategy.
func (c *connTx) outerErr() error {
	if c.ended() {
		return errTxEnded
	}
	return nil
}
