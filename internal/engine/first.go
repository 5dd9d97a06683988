package engine

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// firstStep is a run's first step (Spec.First) as its Tx carries it: the
// statement that rides in the first batch, with BEGIN or with the body's
// first statement, and whose answer decides whether the body's work may
// commit.
type firstStep struct {
	fn            func(ctx context.Context, q Querier) error // nil once sent, or when there is none
	withStatement bool                                       // sent with the body's first statement
	aborts        bool                                       // its statement fails when it stops the run (Spec.FirstAborts)
}

// firstWithCommit reports whether the first step, not sent yet, can travel
// with COMMIT (Spec.FirstAborts): its statement aborts the transaction
// whenever it stops the run, the transaction begins in a batch (a pool or
// a connection), and ctx has not ended.
func (t *Tx) firstWithCommit(ctx context.Context) bool {
	if !t.first.aborts || t.open || ctx.Err() != nil {
		return false
	}
	_, ok := t.s.(*connTx)
	return ok
}

// begin sends the first batch, if it has not been sent: BEGIN (or, before
// it, SAVEPOINT), the first step's statement and extra, whose first nDeferred are deferred
// statements. It records what stops the run.
func (t *Tx) begin(ctx context.Context, extra []stmt, nDeferred int) {
	if t.open {
		return
	}
	t.open = true
	first := t.first.fn
	t.first.fn = nil
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
	}
}

// sendFirst sends the first batch (see begin), with first's statement when
// there is a first step. It returns the failure to begin, and leaves each
// statement's result in it.
func (t *Tx) sendFirst(ctx context.Context, first *stmt, extra []stmt, nDeferred int) error {
	br, closed, err := t.sendBegin(ctx, func(b *pgx.Batch) {
		if first != nil {
			b.Queue(first.sql, first.args...)
		}
		for _, s := range extra {
			b.Queue(s.sql, s.args...)
		}
	})
	if err != nil {
		if pe, ok := errors.AsType[pgx.ErrPreprocessingBatch](err); ok && !closed {
			return refused(pe, first, extra, nDeferred, err)
		}
		return &beginError{err: err}
	}
	t.readFirst(br, first, extra)
	// When BEGIN was not in the batch (after a SAVEPOINT or a Beginner's
	// BeginTx of its own), pgx's refusal of the batch is the answer of its
	// first statement (see Tx.sendBegin).
	head := first
	if head == nil && len(extra) > 0 {
		head = &extra[0]
	}
	if head != nil {
		if pe, ok := errors.AsType[pgx.ErrPreprocessingBatch](head.err); ok {
			return refused(pe, first, extra, nDeferred, head.err)
		}
	}
	return nil
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

// readFirst reads the first batch's results after BEGIN's.
func (t *Tx) readFirst(br pgx.BatchResults, first *stmt, extra []stmt) {
	var err error
	if first != nil {
		first.read(br)
		err = first.err
	}
	failed := -1
	if err != nil {
		fail(extra, err)
	} else {
		failed = readAll(br, extra)
	}
	if cerr := br.Close(); failed < 0 && err == nil && cerr != nil {
		// pgx reports a failure after the last statement read again on
		// Close.
		fail(extra, cerr)
		if first != nil && len(extra) == 0 {
			first.err = cerr
		}
	}
}

// firstQuerier is the Querier a first step sends its statement through: the
// statement travels in the first batch.
type firstQuerier struct {
	t         *Tx
	extra     []stmt // body statements sent after it
	nDeferred int
	sent      bool
	beginErr  error
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
