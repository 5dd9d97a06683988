package engine

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Tx is the transaction (or savepoint) of a run, as its body sees it: a
// pgx.Tx whose statements are sent lazily. The first batch carries BEGIN
// (or follows SAVEPOINT), the first step and whatever the body has sent so
// far; deferred statements (Deferred) wait for the body's next statement or
// for the end. How it begins and ends is its strategy (see strategy). Once
// the first step has stopped the run, BEGIN has failed, a deferred
// statement has failed, or a statement of the body has ended the
// transaction, every later statement returns that error unsent.
type Tx struct {
	s strategy // how it begins and ends: the strategy value that embeds this Tx
	// run is set for a run's own transaction, which only the engine ends.
	run   bool
	first firstStep

	open  bool   // the first batch was sent
	under pgx.Tx // where statements go once open
	queue []stmt // deferred statements not sent yet
	done  bool   // committed or rolled back
	lost  bool   // the connection was found closed when the transaction ended

	beginErr error // the transaction could not begin
	firstErr error // the first step stopped the run
	deferErr error // a deferred statement failed
}

var _ pgx.Tx = (*Tx)(nil)

// err is the error every statement gets now, or nil.
func (t *Tx) err() error {
	switch {
	case t.done:
		return errTxDone
	case t.beginErr != nil:
		return t.beginErr
	case t.firstErr != nil && errors.Is(t.firstErr, ErrRollback):
		return ErrNotNew
	case t.firstErr != nil:
		return t.firstErr
	case t.deferErr != nil:
		return t.deferErr
	}
	return t.s.outerErr()
}

// cause is why the run failed, when err is set: the failure to begin, the
// first step's answer, the failed deferred statement, or the transaction's
// end.
func (t *Tx) cause() error {
	switch {
	case t.beginErr != nil:
		return t.beginErr
	case t.firstErr != nil:
		return t.firstErr
	case t.deferErr != nil:
		return t.deferErr
	}
	return t.err() // ended under the run, by someone else
}

// ended reports whether the transaction the run opened is no longer open on
// its connection, which a statement sent as SQL (ROLLBACK, COMMIT) does
// behind the engine's back: the statements after it would each commit on
// their own. The connection reports its transaction status with every
// answer, so asking costs no round trip. A closed connection is left to its
// statements' errors, and a busy one (the rows of the first batch still
// being read) has not reported yet.
func (t *Tx) ended() bool {
	if !t.open || t.under == nil {
		return false
	}
	c := t.under.Conn()
	if c == nil || c.IsClosed() {
		return false
	}
	pc := c.PgConn()
	return !pc.IsBusy() && pc.TxStatus() == 'I'
}

// direct reports whether a statement can go straight to the transaction,
// with nothing to send before it.
func (t *Tx) direct() bool {
	return t.open && len(t.queue) == 0 && t.err() == nil
}

// send sends the deferred statements and then, when cur is not nil, cur, in
// one round trip, in the first batch when that has not been sent. cur gets
// its own result; the error is the one every statement gets now.
func (t *Tx) send(ctx context.Context, cur *stmt) error {
	stmts, n := t.queue, len(t.queue)
	t.queue = nil
	if cur != nil {
		stmts = append(stmts, *cur)
	}
	switch {
	case !t.open:
		t.begin(ctx, stmts, n)
	case len(stmts) > 0:
		br := t.under.SendBatch(ctx, batchOf(stmts))
		failed := readAll(br, stmts)
		if cerr := br.Close(); cerr != nil && failed < 0 {
			fail(stmts, cerr)
		}
	}
	if err := t.err(); err != nil {
		return err
	}
	for _, s := range stmts[:n] {
		if s.err != nil {
			t.deferErr = &DeferredError{Err: s.err}
			return t.deferErr
		}
	}
	if cur != nil {
		*cur = stmts[n]
	}
	return nil
}

// flush sends whatever is pending, for the calls that cannot share a round
// trip: the first batch, and the deferred statements.
func (t *Tx) flush(ctx context.Context) error {
	if err := t.err(); err != nil {
		return err
	}
	if !t.open || len(t.queue) > 0 {
		return t.send(ctx, nil)
	}
	return nil
}

// commitStart is what every strategy's commit does first. It reports
// whether that ended the transaction, with the error to return: one that
// every statement gets now (the transaction is rolled back), the failure
// of deferred statements that had to begin the transaction, or nil when
// nothing was ever sent and there is nothing to commit.
func (t *Tx) commitStart(bctx, cctx context.Context) (ended bool, err error) {
	if err := t.err(); err != nil {
		if t.done {
			return true, err
		}
		return true, t.abortWith(cctx, 0, err)
	}
	if !t.open && (len(t.queue) > 0 || t.first.fn != nil) {
		// Only deferred statements, or a first step not sent yet: they
		// begin the transaction.
		if err := t.send(bctx, nil); err != nil {
			return true, t.abortWith(cctx, 0, &rolledBackError{err: err})
		}
	}
	if !t.open {
		t.end() // nothing was sent: nothing to commit
		return true, nil
	}
	return false, nil
}

// abort rolls the transaction back under a context the caller's
// cancellation does not reach (bounded by timeout when it is positive), so
// that the connection goes back to its pool clean, and returns the
// rollback's error, which only a savepoint's rollback returns: a failed
// rollback of a transaction leaves nothing to do, since pgx closes a
// connection whose rollback failed and the server rolls back what that
// connection had open.
func (t *Tx) abort(ctx context.Context, timeout time.Duration) error {
	if t.done {
		return nil
	}
	rctx := context.WithoutCancel(ctx)
	if timeout > 0 {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(rctx, timeout)
		defer cancel()
	}
	return t.rollback(rctx)
}

// abortWith aborts (see abort) the transaction that err ended and returns
// err, or, when the rollback of a savepoint failed, an *unusableError.
func (t *Tx) abortWith(ctx context.Context, timeout time.Duration, err error) error {
	if rerr := t.abort(ctx, timeout); rerr != nil {
		return &unusableError{cause: err, err: rerr}
	}
	return err
}

// rollback rolls the transaction or savepoint back, as its strategy does
// once something was sent.
func (t *Tx) rollback(ctx context.Context) error {
	if t.done {
		return errTxDone
	}
	if !t.open || t.under == nil {
		t.end()
		return nil
	}
	return t.s.rollback(ctx)
}

// end marks the transaction ended and hands its connection back, noting
// first whether the connection was lost.
func (t *Tx) end() { t.endWith(t.connClosed()) }

// endWith is end with what was found of the connection before it was
// handed back (once handed back, it is another goroutine's).
func (t *Tx) endWith(lost bool) {
	if !t.done {
		t.lost = lost
	}
	t.done, t.queue = true, nil
	t.s.release()
}

// connClosed reports whether the transaction's connection is known closed.
// Once the transaction has ended, it reports what was found then.
func (t *Tx) connClosed() bool {
	if t.done {
		return t.lost
	}
	if t.under == nil {
		return false
	}
	c := t.under.Conn()
	return c != nil && c.IsClosed()
}

// Exec implements pgx.Tx.
func (t *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.direct() {
		return t.under.Exec(ctx, sql, args...)
	}
	if err := t.err(); err != nil {
		return pgconn.CommandTag{}, err
	}
	s := stmt{sql: sql, args: args}
	if err := t.send(ctx, &s); err != nil {
		return pgconn.CommandTag{}, err
	}
	return s.tag, s.err
}

// QueryRow implements pgx.Tx. A row that has to travel with the first batch
// or with deferred statements is sent when it is scanned, which
// sqlc-generated code does at once.
func (t *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.direct() {
		return t.under.QueryRow(ctx, sql, args...)
	}
	if err := t.err(); err != nil {
		return errRow{err}
	}
	return &pendingRow{t: t, ctx: ctx, sql: sql, args: args}
}

// pendingRow is the row of a statement sent with the first batch or with
// deferred statements.
type pendingRow struct {
	t    *Tx
	ctx  context.Context
	sql  string
	args []any
}

// Scan sends the row's statement, with whatever is pending before it, and
// scans its row into dest.
func (r *pendingRow) Scan(dest ...any) error {
	t := r.t
	if t.direct() {
		return t.under.QueryRow(r.ctx, r.sql, r.args...).Scan(dest...)
	}
	if dest == nil {
		dest = []any{} // a row scanned into nothing is still a row
	}
	s := stmt{sql: r.sql, args: r.args, dest: dest}
	if err := t.send(r.ctx, &s); err != nil {
		return err
	}
	return s.err
}

// errRow is a row whose Scan returns err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// Query implements pgx.Tx. As the transaction's first statement (with no
// first step to send), it travels with BEGIN (or after SAVEPOINT) and the
// deferred statements, and its rows are read from that batch. Otherwise rows cannot
// outlive a batch, so a query is sent after what is pending.
func (t *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if !t.open && t.first.fn == nil && t.err() == nil {
		return t.queryFirst(ctx, sql, args)
	}
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	return t.under.Query(ctx, sql, args...)
}

// SendBatch implements pgx.Tx.
func (t *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.flush(ctx); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return t.under.SendBatch(ctx, b)
}

// CopyFrom implements pgx.Tx.
func (t *Tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.flush(ctx); err != nil {
		return 0, err
	}
	return t.under.CopyFrom(ctx, table, columns, src)
}

// Prepare implements pgx.Tx.
func (t *Tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	return t.under.Prepare(ctx, name, sql)
}

// Begin implements pgx.Tx: a savepoint in the transaction, run by the same
// rules (its SAVEPOINT is sent before its first statement, its deferred
// statements with RELEASE).
func (t *Tx) Begin(context.Context) (pgx.Tx, error) {
	if err := t.err(); err != nil {
		return nil, err
	}
	return newSavepoint(t, firstStep{}, false), nil
}

// LargeObjects implements pgx.Tx. It sends what is pending first.
func (t *Tx) LargeObjects() pgx.LargeObjects {
	_ = t.flush(context.Background())
	if t.under == nil {
		return pgx.LargeObjects{}
	}
	return t.under.LargeObjects()
}

// Conn implements pgx.Tx. It sends what is pending first; it is nil when no
// connection could be had.
func (t *Tx) Conn() *pgx.Conn {
	_ = t.flush(context.Background())
	if t.under == nil {
		return nil
	}
	return t.under.Conn()
}

// Config returns the configuration of the pool or connection the
// transaction runs on, a copy, without sending anything; nil on a Beginner
// of another kind, or in a transaction of the caller's that does not tell
// its own. It is for code that asks a transaction for its connection only
// to read the configuration: Conn must first send the first batch and the
// deferred statements, a round trip of their own. River's pgx driver asks
// for Config, then Conn, before each statement it sends, for the query
// execution mode.
func (t *Tx) Config() *pgxpool.Config {
	switch s := t.s.(type) {
	case *connTx:
		return s.config()
	case *savepointTx:
		return s.config()
	}
	return nil
}

// Commit implements pgx.Tx for savepoints the body began: it releases the
// savepoint, with its deferred statements.
func (t *Tx) Commit(ctx context.Context) error {
	if t.run {
		return errRunOwned
	}
	return t.s.commit(ctx, ctx)
}

// Rollback implements pgx.Tx for savepoints the body began.
func (t *Tx) Rollback(ctx context.Context) error {
	if t.run {
		return errRunOwned
	}
	return t.rollback(ctx)
}
