package txhook

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrNotNew is what a handler's statements return under
// Config.DedupeWithFirstStatement when the dedupe step, sent with the first
// of them, found the event's key already committed or held by another
// delivery. The transaction rolls back, and the delivery's outcome is the
// dedupe step's (duplicate or in flight) whatever the handler returns.
var ErrNotNew = errors.New("txhook: event key already committed or in flight; the transaction rolls back")

// lazyTx is the transaction a handler gets from Process on a pool or a
// connection. Nothing is sent until it is needed: BEGIN and the dedupe step
// travel in one pgx batch, before the handler runs or, under
// Config.DedupeWithFirstStatement, with the handler's first statement. The
// statements a handler queues through Deferred travel with its next
// statement or with COMMIT. Once the key is found not new, or the batch's
// BEGIN, dedupe step or a deferred statement fails, every later statement
// returns that error without being sent.
//
// It runs on a connection of its own (acquired from a pool at the first
// send), so that COMMIT can share a batch with the deferred statements.
type lazyTx struct {
	p    *Processor
	ev   Event
	src  batchSender // the pool or connection the transaction runs on
	opts pgx.TxOptions

	conn   *pgx.Conn     // the connection; set once sent
	pooled *pgxpool.Conn // conn's pool handle, released when the transaction ends
	sent   bool          // the first batch was sent
	tx     pgx.Tx        // the transaction begun on conn; set once sent
	b      beginFirst    // sends the first batch
	queue  []pending     // deferred statements not sent yet
	stmt   [1]pending    // backing store for a statement sent with the queue
	done   bool          // committed or rolled back
	res    Result        // the dedupe step's result when err is ErrNotNew
	err    error         // see lazyTx
}

var _ pgx.Tx = (*lazyTx)(nil)

// errTxDone is returned by a lazyTx used after its transaction ended.
var errTxDone = fmt.Errorf("txhook: the event's transaction has ended: %w", pgx.ErrTxClosed)

// deferredError is the error of a statement queued through Deferred, or of
// the batch that carried it. The transaction rolls back whatever the handler
// returns.
type deferredError struct{ err error }

func (e *deferredError) Error() string { return "deferred statement not applied: " + e.err.Error() }
func (e *deferredError) Unwrap() error { return e.err }

// acquire returns the connection the transaction runs on.
func (lt *lazyTx) acquire(ctx context.Context) error {
	switch s := lt.src.(type) {
	case *pgxpool.Pool:
		c, err := s.Acquire(ctx)
		if err != nil {
			return err
		}
		lt.conn, lt.pooled = c.Conn(), c
	case *pgxpool.Conn:
		lt.conn = s.Conn()
	case *pgx.Conn:
		lt.conn = s
	default:
		return fmt.Errorf("txhook: cannot begin a pipelined transaction on %T", s)
	}
	return nil
}

// start sends BEGIN, the dedupe step and stmts, of which the first queued
// are deferred, in one round trip. It returns lt.err.
func (lt *lazyTx) start(ctx context.Context, stmts []pending, queued int) error {
	lt.sent = true
	if err := lt.acquire(ctx); err != nil {
		lt.err = &beginError{err: err}
		return lt.err
	}
	lt.b = beginFirst{sender: lt.conn, opts: lt.opts, then: stmts}
	b := &lt.b
	res, err := lt.p.dedupe(ctx, b, lt.ev)
	lt.tx = b.tx
	switch {
	case b.tx == nil:
		lt.err = errors.Join(errors.New("txhook: the dedupe step sent nothing"), err)
	case b.beginErr != nil && unsentDeferred(b.beginErr, stmts[:queued]):
		lt.err = &deferredError{err: b.beginErr}
	case b.beginErr != nil:
		lt.err = &beginError{err: b.beginErr}
	case errors.Is(err, errRollback):
		lt.res, lt.err = res, ErrNotNew
	case err != nil:
		lt.err = err
	}
	return lt.err
}

// send sends the queued deferred statements and then, with withStmt,
// lt.stmt[0] in one round trip, with BEGIN and the dedupe step when they
// have not been sent. It returns lt.err; lt.stmt[0] holds the statement's
// own result.
func (lt *lazyTx) send(ctx context.Context, withStmt bool) error {
	stmts, queued := lt.queue, len(lt.queue)
	lt.queue = nil
	switch {
	case withStmt && queued == 0:
		stmts = lt.stmt[:] // no allocation for a statement sent alone
	case withStmt:
		stmts = append(stmts, lt.stmt[0])
	}
	if !lt.sent {
		lt.start(ctx, stmts, queued)
	} else if len(stmts) > 0 {
		br := lt.tx.SendBatch(ctx, queueAll(stmts, ""))
		failed := readPending(br, stmts)
		if cerr := br.Close(); cerr != nil && failed < 0 {
			for i := range stmts {
				stmts[i].err = cerr
			}
		}
	}
	if lt.err != nil {
		return lt.err
	}
	for _, s := range stmts[:queued] {
		if s.err != nil {
			lt.err = &deferredError{err: s.err}
			return lt.err
		}
	}
	if withStmt {
		lt.stmt[0] = stmts[queued]
	}
	return nil
}

// unsentDeferred reports whether err is pgx refusing a batch, before sending
// any of it, for one of the deferred statements (one that cannot be
// prepared, or whose arguments cannot be encoded).
func unsentDeferred(err error, deferred []pending) bool {
	pe, ok := errors.AsType[pgx.ErrPreprocessingBatch](err)
	if !ok {
		return false
	}
	for _, s := range deferred {
		if s.sql == pe.SQL() {
			return true
		}
	}
	return false
}

// queueAll returns a batch of stmts followed, if not empty, by last.
func queueAll(stmts []pending, last string) *pgx.Batch {
	batch := &pgx.Batch{}
	for _, s := range stmts {
		batch.Queue(s.sql, s.args...)
	}
	if last != "" {
		batch.Queue(last)
	}
	return batch
}

// begin sends BEGIN and the dedupe step, if they have not been sent, and
// returns lt.err. The queued deferred statements stay queued.
func (lt *lazyTx) begin(ctx context.Context) error {
	if !lt.sent {
		return lt.start(ctx, nil, 0)
	}
	return lt.err
}

// flush sends whatever is pending, for the methods that cannot share a round
// trip: BEGIN and the dedupe step if not sent, and the deferred statements.
func (lt *lazyTx) flush(ctx context.Context) error {
	if lt.done {
		return errTxDone
	}
	if !lt.sent || len(lt.queue) > 0 {
		return lt.send(ctx, false)
	}
	return lt.err
}

// direct reports whether a statement can go straight to the transaction,
// with nothing to send before it.
func (lt *lazyTx) direct() bool {
	return lt.sent && lt.err == nil && len(lt.queue) == 0 && !lt.done
}

// failed returns the error every statement gets, if any.
func (lt *lazyTx) failed() error {
	if lt.done {
		return errTxDone
	}
	if lt.sent {
		return lt.err
	}
	return nil
}

// deferExec queues a statement for the next round trip (see Deferred).
func (lt *lazyTx) deferExec(sql string, args []any) error {
	if err := lt.failed(); err != nil {
		return err
	}
	lt.queue = append(lt.queue, pending{sql: sql, args: args})
	return nil
}

// Exec implements pgx.Tx.
func (lt *lazyTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if lt.direct() {
		return lt.tx.Exec(ctx, sql, args...)
	}
	if err := lt.failed(); err != nil {
		return pgconn.CommandTag{}, err
	}
	lt.stmt[0] = pending{sql: sql, args: args}
	if err := lt.send(ctx, true); err != nil {
		return pgconn.CommandTag{}, err
	}
	return lt.stmt[0].tag, lt.stmt[0].err
}

// QueryRow implements pgx.Tx. A row that has to travel with BEGIN or with
// deferred statements is sent when it is scanned, which sqlc-generated code
// does at once.
func (lt *lazyTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if lt.direct() {
		return lt.tx.QueryRow(ctx, sql, args...)
	}
	if err := lt.failed(); err != nil {
		return errRow{err}
	}
	return &lazyRow{lt: lt, ctx: ctx, sql: sql, args: args}
}

// lazyRow is the row of a statement sent with BEGIN or deferred statements.
type lazyRow struct {
	lt   *lazyTx
	ctx  context.Context
	sql  string
	args []any
}

// Scan sends the row's statement, with whatever is pending before it, and
// scans its row into dest.
func (r *lazyRow) Scan(dest ...any) error {
	lt := r.lt
	if lt.direct() {
		return lt.tx.QueryRow(r.ctx, r.sql, r.args...).Scan(dest...)
	}
	if err := lt.failed(); err != nil {
		return err
	}
	if dest == nil {
		dest = []any{} // a row scanned into nothing is still a row
	}
	lt.stmt[0] = pending{sql: r.sql, args: r.args, dest: dest}
	if err := lt.send(r.ctx, true); err != nil {
		return err
	}
	return lt.stmt[0].err
}

// errRow is a row whose Scan returns err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// Query implements pgx.Tx. Rows cannot outlive a batch, so a query is sent
// after what is pending.
func (lt *lazyTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := lt.flush(ctx); err != nil {
		return nil, err
	}
	return lt.tx.Query(ctx, sql, args...)
}

// SendBatch implements pgx.Tx.
func (lt *lazyTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := lt.flush(ctx); err != nil {
		return errBatch{err}
	}
	return lt.tx.SendBatch(ctx, b)
}

// errBatch is a pgx.BatchResults whose every result is err.
type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow(b) }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }

// CopyFrom implements pgx.Tx.
func (lt *lazyTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := lt.flush(ctx); err != nil {
		return 0, err
	}
	return lt.tx.CopyFrom(ctx, table, columns, src)
}

// Prepare implements pgx.Tx.
func (lt *lazyTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := lt.flush(ctx); err != nil {
		return nil, err
	}
	return lt.tx.Prepare(ctx, name, sql)
}

// Begin implements pgx.Tx: a savepoint in the transaction.
func (lt *lazyTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := lt.flush(ctx); err != nil {
		return nil, err
	}
	return lt.tx.Begin(ctx)
}

// LargeObjects implements pgx.Tx. It begins the transaction first; when the
// key is not new, the large objects' operations run in a transaction that
// rolls back.
func (lt *lazyTx) LargeObjects() pgx.LargeObjects {
	_ = lt.flush(context.Background())
	if lt.tx == nil {
		return pgx.LargeObjects{}
	}
	return lt.tx.LargeObjects()
}

// Conn implements pgx.Tx. It begins the transaction first; when the key is
// not new, statements run on the connection are in a transaction that rolls
// back. It is nil when no connection could be had.
func (lt *lazyTx) Conn() *pgx.Conn {
	_ = lt.flush(context.Background())
	return lt.conn
}

// Commit implements pgx.Tx. The processor commits only a transaction whose
// dedupe step found the key new. Deferred statements still queued travel
// with COMMIT, in one round trip; when one fails, the transaction rolls
// back and Commit returns its error.
func (lt *lazyTx) Commit(ctx context.Context) error {
	if lt.done {
		return errTxDone
	}
	if !lt.sent || lt.err != nil {
		return errors.Join(errors.New("txhook: commit of a transaction that was not begun or has failed"), lt.err)
	}
	defer lt.end()
	if len(lt.queue) == 0 {
		return lt.tx.Commit(ctx)
	}
	return lt.commitQueued(ctx)
}

// commitQueued sends the deferred statements and COMMIT in one batch.
func (lt *lazyTx) commitQueued(ctx context.Context) error {
	stmts := lt.queue
	lt.queue = nil
	br := lt.conn.SendBatch(ctx, queueAll(stmts, "commit"))
	var err error
	var tag pgconn.CommandTag
	if failed := readPending(br, stmts); failed >= 0 {
		err = &deferredError{err: stmts[failed].err}
	} else {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	switch {
	case lt.conn.IsClosed():
		// The connection failed: COMMIT may have been applied.
		return err
	case lt.conn.PgConn().TxStatus() != 'I':
		// COMMIT did not run: a deferred statement failed, or the batch
		// could not be sent. The transaction is still open: roll it back.
		if rerr := lt.tx.Rollback(ctx); rerr != nil {
			return errors.Join(err, rerr) // the connection is closed: unknown
		}
		if err == nil {
			err = errors.New("txhook: commit was not applied")
		}
		return &rolledBackError{err: err}
	case err != nil:
		return err // COMMIT's own error: the server rolled back
	case tag.String() == "ROLLBACK":
		return pgx.ErrTxCommitRollback
	}
	return nil
}

// rolledBackError is a commit error after which the transaction is known to
// have rolled back.
type rolledBackError struct{ err error }

func (e *rolledBackError) Error() string { return e.err.Error() }
func (e *rolledBackError) Unwrap() error { return e.err }

// Rollback implements pgx.Tx. A transaction never begun has nothing to roll
// back.
func (lt *lazyTx) Rollback(ctx context.Context) error {
	if lt.done {
		return errTxDone
	}
	defer lt.end()
	if lt.tx == nil {
		return nil
	}
	return lt.tx.Rollback(ctx)
}

// end hands the connection back to its pool.
func (lt *lazyTx) end() {
	lt.done, lt.queue = true, nil
	if lt.pooled != nil {
		lt.pooled.Release()
		lt.pooled = nil
	}
}

// processPipelined is process on a pool or a connection: the handler runs
// in a lazyTx, after the round trip of BEGIN and the dedupe step or, under
// Config.DedupeWithFirstStatement, at once, with the dedupe step sent with
// its first statement (or, when it sends none, after it returns).
func (p *Processor) processPipelined(ctx context.Context, s batchSender, ev Event, h HandlerFunc) (Result, error) {
	var lt *lazyTx
	begin := func(context.Context) (pgx.Tx, error) {
		lt = &lazyTx{p: p, ev: ev, src: s, opts: p.txOpts.pgx()}
		return lt, nil
	}
	var res Result
	err := runTxWith(ctx, p.txOpts, begin, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		res, err = p.handlePipelined(ctx, lt, ev, h)
		return err
	}, func() { p.crash.at(CrashBeforeCommit) })
	return p.finish(ctx, ev, res, err)
}

// handlePipelined runs h in lt. The dedupe step's answer decides over h's:
// a key that is not new rolls back whatever h returned, and a failed dedupe
// step is the attempt's error (a serialization failure is then retried), as
// is a failed deferred statement.
func (p *Processor) handlePipelined(ctx context.Context, lt *lazyTx, ev Event, h HandlerFunc) (Result, error) {
	if !p.withFirst {
		lt.begin(ctx)
	}
	if lt.err == nil {
		herr := h(ctx, lt, ev)
		if herr != nil {
			lt.queue = nil // rolled back: nothing queued needs to run
		}
		if lt.begin(ctx); lt.err == nil {
			return p.handled(herr)
		}
	}
	if errors.Is(lt.err, ErrNotNew) {
		return lt.res, errRollback
	}
	return Result{}, lt.err
}
