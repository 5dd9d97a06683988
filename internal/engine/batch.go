package engine

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// queryFirst sends the first batch with a multi-row query at its end:
// BEGIN, the deferred statements, then the query, in one round trip (after
// SAVEPOINT's own in a savepoint). The query's rows are read from the
// batch, which ends when they are closed (or read to the end). It records what stops the run, as begin
// does.
func (t *Tx) queryFirst(ctx context.Context, sql string, args []any) (pgx.Rows, error) {
	t.open = true
	stmts := t.queue
	t.queue = nil
	br, closed, err := t.sendBegin(ctx, func(b *pgx.Batch) {
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
		if _, ok := errors.AsType[pgx.ErrPreprocessingBatch](stmts[failed].err); ok {
			// BEGIN was not in the batch (see Tx.sendBegin): pgx
			// refused the batch.
			return nil, t.queryRefused(stmts, stmts[failed].err, t.connClosed())
		}
		t.deferErr = &DeferredError{Err: stmts[failed].err}
		return nil, t.deferErr
	}
	rows, err := br.Query() // otherwise its error is the rows' Err
	if _, ok := errors.AsType[pgx.ErrPreprocessingBatch](err); ok {
		// Likewise.
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
