package engine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// kind is how a Tx begins and ends.
type kind int

const (
	// onConn: a pool or a connection. BEGIN travels in the first batch;
	// COMMIT travels with the deferred statements.
	onConn kind = iota
	// onTx: any other Beginner (a wrapper). Its BeginTx is a round trip of
	// its own; then batches go through the transaction it returns, and
	// COMMIT through that transaction's Commit.
	onTx
	// inSavepoint: the caller's transaction. SAVEPOINT is a round trip of
	// its own, before the first batch, so that nothing in that batch can
	// fail before the savepoint exists; RELEASE SAVEPOINT travels with the
	// deferred statements.
	inSavepoint
)

// SQL the engine sends besides the caller's statements.
const (
	// boundSQL saves the session's lock_timeout, sets the first step's
	// bound, for the body's statements sent before the first step answered,
	// and saves the bound as the server spells it (2000ms is 2s).
	boundSQL = "-- name: LockTimeoutBound\nselect set_config('txhook.lock_timeout', current_setting('lock_timeout'), true), set_config('txhook.lock_timeout_bound', set_config('lock_timeout', $1, true), true)"
	// unboundSQL restores the saved lock_timeout for the body's later
	// statements, when the bound is still in force: a body statement sent
	// with the first step that set lock_timeout itself (SET LOCAL
	// lock_timeout) keeps its setting for the rest of the transaction.
	unboundSQL = "-- name: LockTimeoutRestored\nselect case when current_setting('lock_timeout') = current_setting('txhook.lock_timeout_bound') then set_config('lock_timeout', current_setting('txhook.lock_timeout'), true) end"
)

// stmt is a statement sent in a batch: an Exec, or a QueryRow whose row is
// scanned into dest.
type stmt struct {
	sql  string
	args []any
	dest []any // the row's destinations; nil for an Exec
	tag  pgconn.CommandTag
	// err is the statement's error, or the batch's when the statement
	// succeeded but the batch failed after it.
	err error
}

// read reads the statement's result from br.
func (s *stmt) read(br pgx.BatchResults) {
	if s.dest == nil {
		s.tag, s.err = br.Exec()
		return
	}
	s.err = br.QueryRow().Scan(s.dest...)
}

// readAll reads the results of stmts, sent in order in one batch, from br.
// The server skips what follows a failed statement: those statements get
// its error. It returns the index of the first failed statement, or -1.
func readAll(br pgx.BatchResults, stmts []stmt) int {
	for i := range stmts {
		stmts[i].read(br)
		if err := stmts[i].err; err != nil {
			fail(stmts[i+1:], err)
			return i
		}
	}
	return -1
}

// fail gives each of stmts the error err.
func fail(stmts []stmt, err error) {
	for i := range stmts {
		stmts[i].err = err
	}
}

// batchOf returns a batch of stmts followed by the statements in then.
func batchOf(stmts []stmt, then ...string) *pgx.Batch {
	b := &pgx.Batch{}
	for _, s := range stmts {
		b.Queue(s.sql, s.args...)
	}
	for _, sql := range then {
		b.Queue(sql)
	}
	return b
}

// Tx is the transaction (or savepoint) of a run, as its body sees it: a
// pgx.Tx whose statements are sent lazily. The first batch carries BEGIN
// (or follows SAVEPOINT), the first step and whatever the body has sent so
// far; deferred statements (Deferred) wait for the body's next statement or
// for the end. A savepoint's SAVEPOINT goes after what its caller's
// transaction deferred until then; the savepoint's later statements go
// past what that transaction defers (see enclosing).
// Once the first step has stopped the run, BEGIN has failed, or a deferred
// statement has failed, every later statement returns that error unsent.
type Tx struct {
	kind   kind
	db     Beginner // onConn, onTx: where the transaction begins
	parent pgx.Tx   // inSavepoint: the caller's transaction
	opts   pgx.TxOptions
	// run is set for a run's own transaction, which only the engine ends.
	run bool

	first              func(ctx context.Context, q Querier) error // nil once sent, or when there is none
	withFirstStatement bool
	bound              string // the lock_timeout of body statements sent with first

	open   bool          // the first batch was sent
	depth  int           // inSavepoint: how many savepoints enclose this one, plus one
	saved  bool          // inSavepoint: SAVEPOINT succeeded
	under  pgx.Tx        // where statements go once open
	pooled *pgxpool.Conn // the connection acquired from a pool; released at the end
	queue  []stmt        // deferred statements not sent yet
	done   bool          // committed or rolled back
	lost   bool          // the connection was found closed when the transaction ended

	beginErr error // the transaction could not begin
	firstErr error // the first step stopped the run
	deferErr error // a deferred statement failed
	// boundHit reports that the first step found its key new but a body
	// statement sent with it waited on a lock past the bound (see
	// boundCut).
	boundHit bool
}

var _ pgx.Tx = (*Tx)(nil)

// newTx returns the transaction of one attempt of a run at t.
func newTx(t Target, opts pgx.TxOptions, first func(context.Context, Querier) error, withFirstStatement bool, bound string) *Tx {
	tx := &Tx{opts: opts, first: first, withFirstStatement: withFirstStatement && first != nil, bound: bound, run: true}
	switch {
	case t.parent != nil:
		tx.kind, tx.parent, tx.depth = inSavepoint, t.parent, depthIn(t.parent)
	case batchBegins(t.db):
		tx.kind, tx.db = onConn, t.db
	default:
		tx.kind, tx.db = onTx, t.db
	}
	return tx
}

// depthIn is the depth of a savepoint begun in parent: one more than
// parent's own when parent is a savepoint of the engine's, and 1 otherwise.
func depthIn(parent pgx.Tx) int {
	if p, ok := parent.(*Tx); ok {
		return p.depth + 1
	}
	return 1
}

// savepointName is the name of the savepoint: unique among the savepoints
// that enclose it, so that ROLLBACK TO and RELEASE, which act on the newest
// savepoint of a name, find this one and not one its body left open.
func (t *Tx) savepointName() string {
	return "txhook_" + strconv.Itoa(t.depth)
}

// batchBegins reports whether BEGIN can travel in a batch on d: a pool or a
// connection.
func batchBegins(d Beginner) bool {
	switch d.(type) {
	case *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn:
		return true
	}
	return false
}

// err is the error every statement gets now, or nil. A savepoint's
// statements get its caller's transaction's error too: they go past that
// transaction (see enclosing), but not once it has failed or ended.
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
	if p, ok := t.parent.(*Tx); ok {
		return p.err()
	}
	return nil
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

// direct reports whether a statement can go straight to the transaction,
// with nothing to send before it.
func (t *Tx) direct() bool {
	return t.open && len(t.queue) == 0 && t.err() == nil
}

// begin sends the first batch, if it has not been sent: BEGIN (or, before
// it, SAVEPOINT), the first step's statement and extra, whose first nDeferred are deferred
// statements. It records what stops the run.
func (t *Tx) begin(ctx context.Context, extra []stmt, nDeferred int) {
	if t.open {
		return
	}
	t.open = true
	first := t.first
	t.first = nil
	if first == nil {
		t.beginErr = t.sendFirst(ctx, nil, extra, nDeferred)
		return
	}
	q := &firstQuerier{t: t, extra: extra, nDeferred: nDeferred}
	err := first(ctx, q)
	switch {
	case q.beginErr != nil:
		t.beginErr = q.beginErr
	case !q.sent:
		t.beginErr = errors.Join(errors.New("txhook: the transaction's first step sent no statement"), err)
	case err != nil:
		t.firstErr = err
	default:
		t.boundHit = q.boundHit
	}
}

// sendFirst sends the first batch (see begin), with first's statement when
// there is a first step. It returns the failure to begin, and leaves each
// statement's result in it.
func (t *Tx) sendFirst(ctx context.Context, first *stmt, extra []stmt, nDeferred int) error {
	bounded := first != nil && len(extra) > 0 && t.bound != ""
	br, closed, err := t.beginBatch(ctx, func(b *pgx.Batch) {
		if bounded {
			b.Queue(boundSQL, t.bound)
		}
		if first != nil {
			b.Queue(first.sql, first.args...)
		}
		for _, s := range extra {
			b.Queue(s.sql, s.args...)
		}
		if bounded {
			b.Queue(unboundSQL)
		}
	})
	if err != nil {
		if pe, ok := errors.AsType[pgx.ErrPreprocessingBatch](err); ok && !closed {
			return refused(pe, first, extra, nDeferred, err)
		}
		return &beginError{err: err}
	}
	t.readFirst(br, bounded, first, extra)
	if t.kind == inSavepoint {
		// After a SAVEPOINT of its own, pgx's refusal of the batch is the
		// answer of its first statement.
		head := first
		if head == nil && len(extra) > 0 {
			head = &extra[0]
		}
		if head != nil {
			if pe, ok := errors.AsType[pgx.ErrPreprocessingBatch](head.err); ok {
				return refused(pe, first, extra, nDeferred, head.err)
			}
		}
	}
	return nil
}

// beginBatch sends a first batch: BEGIN, as the transaction's kind needs,
// and then what queue adds, in one round trip, and reads the BEGIN's result;
// the rest of br is the caller's to read. A savepoint's first batch follows
// its SAVEPOINT, sent on its own (see savepointBatch). When the batch fails
// to begin, a pooled connection goes back (or, closed, out of the pool), and
// a session the server had ended before the batch is replaced once: nothing
// of the batch ran on it, so it is sent again on another connection. A
// statement pgx refused (one that cannot be prepared, arguments that cannot
// be encoded) is not sent again. Otherwise the error is returned, with
// whether the connection was found closed.
func (t *Tx) beginBatch(ctx context.Context, queue func(b *pgx.Batch)) (br pgx.BatchResults, closed bool, err error) {
	if t.kind == inSavepoint {
		return t.savepointBatch(ctx, queue)
	}
	_, fromPool := t.db.(*pgxpool.Pool)
	for try := 0; ; try++ {
		b := &pgx.Batch{}
		if t.kind == onConn {
			b.BeginTx(t.opts)
		}
		queue(b)
		br, err = t.sendBatch(ctx, b)
		if err == nil && t.kind != onTx {
			_, err = br.Exec() // BEGIN
		}
		if err == nil {
			return br, false, nil
		}
		if br != nil {
			br.Close()
		}
		closed = t.connClosed()
		if t.pooled != nil {
			// The transaction never began: its connection goes back now.
			t.releaseConn()
			t.under = nil
		}
		if try == 0 && !statementRefused(err) &&
			(pgconn.SafeToRetry(err) || (closed && fromPool) || (t.kind == onTx && Unreachable(err))) {
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

// savepointBatch is beginBatch for a savepoint: SAVEPOINT in a round trip
// of its own, then the batch of what queue adds, whose results are all the
// caller's to read. pgx may send a batch's statements to be prepared before
// the batch itself, and a statement the server refuses then aborts the
// caller's transaction: the savepoint must exist by then for the run to
// roll back to it.
func (t *Tx) savepointBatch(ctx context.Context, queue func(b *pgx.Batch)) (pgx.BatchResults, bool, error) {
	if p, ok := t.parent.(*Tx); ok && !p.open && p.bound != "" {
		// The enclosing run's first batch goes out on its own first: sent
		// in it, SAVEPOINT would run before the batch restores the first
		// step's bound, and rolling the savepoint back would undo the
		// restore, leaving the bound on for the rest of the transaction.
		p.begin(ctx, nil, 0)
		if err := p.err(); err != nil {
			return nil, false, err
		}
	}
	// SAVEPOINT goes through the caller's transaction, after what it had
	// deferred; the savepoint's own statements go past what it defers
	// from now on (see enclosing).
	t.under = t.parent
	if _, err := t.parent.Exec(ctx, "savepoint "+t.savepointName()); err != nil {
		return nil, t.connClosed(), err
	}
	t.saved = true
	t.under = t.enclosing()
	b := &pgx.Batch{}
	queue(b)
	return t.under.SendBatch(ctx, b), false, nil
}

// queryFirst sends the first batch with a multi-row query at its end:
// BEGIN, the deferred statements, then the query, in one round trip (after
// SAVEPOINT's own in a savepoint). The query's rows are read from the
// batch, which ends when they are closed (or read to the end). It records what stops the run, as begin
// does.
func (t *Tx) queryFirst(ctx context.Context, sql string, args []any) (pgx.Rows, error) {
	t.open = true
	stmts := t.queue
	t.queue = nil
	br, closed, err := t.beginBatch(ctx, func(b *pgx.Batch) {
		for _, s := range stmts {
			b.Queue(s.sql, s.args...)
		}
		b.Queue(sql, args...)
	})
	if err != nil {
		return nil, t.queryRefused(stmts, err, closed)
	}
	if failed := readAll(br, stmts); failed >= 0 {
		br.Close()
		if _, ok := errors.AsType[pgx.ErrPreprocessingBatch](stmts[failed].err); ok && t.kind == inSavepoint {
			// After a SAVEPOINT of its own: pgx refused the batch.
			return nil, t.queryRefused(stmts, stmts[failed].err, t.connClosed())
		}
		t.deferErr = &DeferredError{Err: stmts[failed].err}
		return nil, t.deferErr
	}
	rows, err := br.Query() // otherwise its error is the rows' Err
	if _, ok := errors.AsType[pgx.ErrPreprocessingBatch](err); ok && t.kind == inSavepoint {
		rows.Close()
		br.Close()
		return nil, t.queryRefused(stmts, err, t.connClosed())
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// queryRefused records why queryFirst's batch was not sent: the refused
// deferred statement's error, or a failure to begin.
func (t *Tx) queryRefused(stmts []stmt, err error, closed bool) error {
	if pe, ok := errors.AsType[pgx.ErrPreprocessingBatch](err); ok && !closed {
		for _, s := range stmts {
			if s.sql == pe.SQL() {
				t.deferErr = &DeferredError{Err: err}
				return t.deferErr
			}
		}
	}
	t.beginErr = &beginError{err: err}
	return t.beginErr
}

// batchRows are the rows of a query at the end of a batch: the batch ends
// when they are closed or read to the end.
type batchRows struct {
	pgx.Rows
	br     pgx.BatchResults
	closed bool
	err    error // the batch's end
}

// Next implements pgx.Rows.
func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

// Close implements pgx.Rows: it closes the rows and ends the batch.
func (r *batchRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	r.err = r.br.Close()
}

// Err implements pgx.Rows: the rows' error, or the batch's.
func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

// refused is sendFirst's answer when pgx refused the batch before sending
// any of it (a statement that cannot be prepared, arguments that cannot be
// encoded): the refused statement's error for a deferred one, and
// otherwise a failure to begin.
func refused(pe pgx.ErrPreprocessingBatch, first *stmt, extra []stmt, nDeferred int, err error) error {
	for _, s := range extra[:nDeferred] {
		if s.sql == pe.SQL() {
			return &DeferredError{Err: err}
		}
	}
	if first != nil {
		first.err = err
	}
	fail(extra, err)
	return &beginError{err: err}
}

// sendBatch sends the first batch b where the transaction begins: on a pool
// or connection, or in a transaction of its Beginner.
func (t *Tx) sendBatch(ctx context.Context, b *pgx.Batch) (pgx.BatchResults, error) {
	if t.kind == onConn {
		conn, err := t.acquire(ctx)
		if err != nil {
			return nil, err
		}
		br := conn.SendBatch(ctx, b)
		t.under = br.Tx()
		return br, nil
	}
	tx, err := t.db.BeginTx(ctx, t.opts)
	if err != nil {
		return nil, err
	}
	t.under = tx
	return tx.SendBatch(ctx, b), nil
}

// acquire returns the connection a transaction on a pool or connection runs
// on.
func (t *Tx) acquire(ctx context.Context) (*pgx.Conn, error) {
	switch d := t.db.(type) {
	case *pgxpool.Pool:
		c, err := d.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		t.pooled = c
		return c.Conn(), nil
	case *pgxpool.Conn:
		return d.Conn(), nil
	case *pgx.Conn:
		return d, nil
	}
	return nil, errors.New("txhook: no connection to begin a batch on")
}

// readFirst reads the first batch's results after BEGIN's.
func (t *Tx) readFirst(br pgx.BatchResults, bounded bool, first *stmt, extra []stmt) {
	var err error
	if bounded {
		_, err = br.Exec()
	}
	if first != nil {
		if err != nil {
			first.err = err
		} else {
			first.read(br)
			err = first.err
		}
	}
	failed := -1
	if err != nil {
		fail(extra, err)
	} else {
		failed = readAll(br, extra)
		if failed < 0 && bounded {
			_, err = br.Exec()
		}
	}
	cerr := br.Close()
	switch {
	case failed >= 0:
		t.boundHit = bounded && boundCut(extra[failed].err)
	case err == nil && cerr != nil:
		// pgx reports a failure after the last statement read (or of the
		// statement restoring the bound) again on Close.
		fail(extra, cerr)
		if first != nil && len(extra) == 0 {
			first.err = cerr
		}
	}
}

// boundCut reports whether err, the error of a statement sent under the
// first step's bound, may be the bound cutting its lock wait short: a
// lock_timeout that ran out (raised where the server checks for timeouts;
// a NOWAIT's refusal fails at once, whatever the bound, and is the
// statement's own). Without the bound, such a statement could have waited
// longer. txhook's own functions that set their own lock_timeout answer
// with SQLSTATEs of their own (the replay guard's P0T02), not 55P03.
func boundCut(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && pgErr.Code == "55P03" && pgErr.Routine == "ProcessInterrupts"
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

// deferExec queues a statement (see Deferred).
func (t *Tx) deferExec(sql string, args []any) error {
	if err := t.err(); err != nil {
		return err
	}
	t.queue = append(t.queue, stmt{sql: sql, args: args})
	return nil
}

// commit ends the transaction with its deferred statements. On a pool or
// connection, they travel with COMMIT in one batch, under cctx; in a
// Beginner's transaction, they are sent under bctx, the body's context, and
// then COMMIT under cctx; in a savepoint, they travel with RELEASE SAVEPOINT
// in one batch, under bctx. Deferred statements that begin the transaction
// (nothing else was sent) are sent under bctx. A rollback after a failure
// runs under cctx.
func (t *Tx) commit(bctx, cctx context.Context) error {
	if err := t.err(); err != nil {
		if t.done {
			return err
		}
		return t.abortWith(cctx, 0, err)
	}
	if !t.open && len(t.queue) > 0 {
		// Only deferred statements: they begin the transaction.
		if err := t.send(bctx, nil); err != nil {
			return t.abortWith(cctx, 0, &rolledBackError{err: err})
		}
	}
	if !t.open {
		t.end() // nothing was sent: nothing to commit
		return nil
	}
	switch t.kind {
	case onConn:
		defer t.end()
		if len(t.queue) == 0 {
			return t.under.Commit(cctx)
		}
		return t.commitQueued(cctx)
	case onTx:
		if len(t.queue) > 0 {
			if err := t.send(bctx, nil); err != nil {
				return t.abortWith(cctx, 0, &rolledBackError{err: err})
			}
		}
		defer t.end()
		t.lost = t.connClosed() // the wrapper may hand its connection back in Commit
		return t.under.Commit(cctx)
	}
	stmts := t.queue
	t.queue = nil
	br := t.under.SendBatch(bctx, batchOf(stmts, "release savepoint "+t.savepointName()))
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
		return t.abortWith(cctx, 0, err)
	}
	t.end()
	return nil
}

// commitQueued sends the deferred statements and COMMIT in one batch.
func (t *Tx) commitQueued(ctx context.Context) error {
	stmts := t.queue
	t.queue = nil
	conn := t.under.Conn()
	br := conn.SendBatch(ctx, batchOf(stmts, "commit"))
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
	switch {
	case conn.IsClosed() && err != nil:
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Severity == "ERROR" {
			// The server answered a statement with an error, which
			// aborted the transaction before COMMIT; the connection
			// closed after that.
			return &rolledBackError{err: err}
		}
		// The connection failed while the batch was sent or its answers
		// read (the first deferred statement's read then carries the
		// error): COMMIT may have been applied.
		return &CommitUnknownError{Err: err}
	case conn.IsClosed():
		// COMMIT answered; the connection closed after that.
	case conn.PgConn().TxStatus() != 'I':
		// COMMIT did not run: a deferred statement failed, or the batch
		// could not be sent. The transaction is still open: roll it back.
		if rerr := t.under.Rollback(ctx); rerr != nil {
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

// abort rolls the transaction back under a context the caller's
// cancellation does not reach (bounded by timeout when it is positive), so
// that the connection goes back to its pool clean, and returns the
// rollback's error. A failed rollback of a transaction leaves nothing to
// do: pgx closes a connection whose rollback failed, and the server rolls
// back what that connection had open. A failed rollback of a savepoint
// leaves the caller's transaction in a state nobody knows (see abortWith).
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
// err, or, when the rollback of a savepoint failed, a *savepointError.
func (t *Tx) abortWith(ctx context.Context, timeout time.Duration, err error) error {
	if rerr := t.abort(ctx, timeout); rerr != nil && t.kind == inSavepoint {
		return &savepointError{cause: err, err: rerr}
	}
	return err
}

// savepointError reports that a savepoint could not be rolled back after
// its run failed: what the run did may still be in the caller's
// transaction, which is not usable and must be rolled back. It unwraps to
// the rollback's error only: the run's outcome (a duplicate, a permanent
// failure) does not hold.
type savepointError struct{ cause, err error }

func (e *savepointError) Error() string {
	return fmt.Sprintf("rollback to savepoint failed, the enclosing transaction is not usable and must be rolled back: %v (the savepoint's work failed: %v)", e.err, e.cause)
}

func (e *savepointError) Unwrap() error { return e.err }

// rollback rolls the transaction or savepoint back.
func (t *Tx) rollback(ctx context.Context) error {
	if t.done {
		return errTxDone
	}
	defer t.end()
	if !t.open || t.under == nil {
		return nil
	}
	if t.kind != inSavepoint {
		if t.kind == onTx {
			t.lost = t.connClosed() // the wrapper may hand its connection back in Rollback
		}
		err := t.under.Rollback(ctx)
		if errors.Is(err, pgx.ErrTxClosed) {
			return nil // BEGIN failed: nothing to roll back
		}
		return err
	}
	if !t.saved {
		return nil // SAVEPOINT failed: there is nothing of this savepoint to roll back
	}
	// Without arguments, pgx sends this with the simple protocol, which
	// an aborted transaction accepts (a batch would first prepare it, and
	// refuse its two commands). It goes past what the enclosing engine
	// transactions deferred: that is theirs, and waits for their next
	// statement.
	name := t.savepointName()
	if _, err := t.enclosing().Exec(ctx, "rollback to savepoint "+name+"; release savepoint "+name); err != nil {
		return fmt.Errorf("rollback to savepoint %s: %w", name, err)
	}
	return nil
}

// enclosing is the transaction a savepoint's own statements go to once
// SAVEPOINT has been sent: the caller's transaction or, when that is the
// engine's, the transaction under it. They go past what the enclosing
// engine transactions deferred: a statement belongs to the transaction it
// was deferred on, and waits for that transaction's next statement.
func (t *Tx) enclosing() pgx.Tx {
	q := t.parent
	for {
		p, ok := q.(*Tx)
		if !ok || p.under == nil {
			return q
		}
		q = p.under
	}
}

// end marks the transaction ended and hands its connection back to its
// pool, noting first whether the connection was lost: once handed back, the
// connection is another goroutine's.
func (t *Tx) end() {
	if !t.done && t.kind != onTx {
		t.lost = t.connClosed()
	}
	t.done, t.queue = true, nil
	t.releaseConn()
}

func (t *Tx) releaseConn() {
	if t.pooled != nil {
		t.pooled.Release()
		t.pooled = nil
	}
}

// connClosed reports whether the transaction's connection is known closed.
// Once the transaction has ended, it reports what was found then.
func (t *Tx) connClosed() bool {
	if t.done {
		return t.lost
	}
	if t.under == nil {
		return t.pooled != nil && t.pooled.Conn().IsClosed()
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
	if !t.open && t.first == nil && t.err() == nil {
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
	return &Tx{kind: inSavepoint, parent: t, depth: depthIn(t)}, nil
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

// errRunOwned is returned when a run's body commits or rolls back the
// transaction it was given.
var errRunOwned = errors.New("txhook: the transaction is committed or rolled back by txhook, not by the handler")

// Commit implements pgx.Tx for savepoints the body began: it releases the
// savepoint, with its deferred statements.
func (t *Tx) Commit(ctx context.Context) error {
	if t.run {
		return errRunOwned
	}
	return t.commit(ctx, ctx)
}

// Rollback implements pgx.Tx for savepoints the body began.
func (t *Tx) Rollback(ctx context.Context) error {
	if t.run {
		return errRunOwned
	}
	return t.rollback(ctx)
}

// Deferred returns a Querier whose Exec queues its statement in tx, when tx
// is an engine transaction, and tx itself otherwise.
func Deferred(tx pgx.Tx) Querier {
	if t, ok := tx.(*Tx); ok {
		return deferred{t}
	}
	return tx
}

// deferred is the Querier Deferred returns.
type deferred struct{ t *Tx }

// Exec queues the statement and returns an empty command tag.
func (d deferred) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, d.t.deferExec(sql, args)
}

// Query runs at once, after what is queued.
func (d deferred) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return d.t.Query(ctx, sql, args...)
}

// QueryRow runs at once, after what is queued.
func (d deferred) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return d.t.QueryRow(ctx, sql, args...)
}

// firstQuerier is the Querier a first step sends its statement through: the
// statement travels in the first batch.
type firstQuerier struct {
	t         *Tx
	extra     []stmt // body statements sent after it
	nDeferred int
	sent      bool
	beginErr  error
	boundHit  bool
}

// Exec implements Querier.
func (q *firstQuerier) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	s := stmt{sql: sql, args: args}
	if err := q.send(ctx, &s); err != nil {
		return pgconn.CommandTag{}, err
	}
	return s.tag, s.err
}

// QueryRow implements Querier; the statement is sent when the row is
// scanned.
func (q *firstQuerier) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return &firstRow{q: q, ctx: ctx, sql: sql, args: args}
}

// Query implements Querier. A first step's statement answers one row at
// most: its rows could not outlive the batch.
func (q *firstQuerier) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errors.New("txhook: a transaction's first step cannot be a multi-row query")
}

func (q *firstQuerier) send(ctx context.Context, s *stmt) error {
	if q.sent {
		return errors.New("txhook: a transaction's first step sends one statement")
	}
	q.sent = true
	if err := q.t.sendFirst(ctx, s, q.extra, q.nDeferred); err != nil {
		q.beginErr = err
		return err
	}
	q.boundHit, q.t.boundHit = q.t.boundHit, false
	return nil
}

// firstRow is the row of a first step's statement.
type firstRow struct {
	q    *firstQuerier
	ctx  context.Context
	sql  string
	args []any
}

// Scan sends the first batch and scans the first step's row into dest.
func (r *firstRow) Scan(dest ...any) error {
	if dest == nil {
		dest = []any{}
	}
	s := stmt{sql: r.sql, args: r.args, dest: dest}
	if err := r.q.send(r.ctx, &s); err != nil {
		return err
	}
	return s.err
}
