package txhook

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook/db"
)

// batchSender is a database that can send a pgx.Batch which begins a
// transaction (pgx.Batch.BeginTx).
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// pipeliner returns d as a batchSender when BEGIN can share a round trip with
// the transaction's first statement on it, and nil otherwise. A pgx.Tx
// cannot: its statements already run inside a transaction.
func pipeliner(d Beginner) batchSender {
	switch s := d.(type) {
	case *pgxpool.Pool:
		return s
	case *pgxpool.Conn:
		return s
	case *pgx.Conn:
		return s
	}
	return nil
}

// beginFirst is a db.DBTX that begins a transaction with the first statement
// run through it: BEGIN and that statement travel in one pgx batch, so one
// round trip both opens the transaction and answers the statement. Later
// statements run on the transaction begun. It lets sqlc-generated queries be
// the first statement without repeating their SQL.
type beginFirst struct {
	sender batchSender
	opts   pgx.TxOptions

	// tx is the transaction begun, nil until the first statement is sent.
	// It must be committed or rolled back even when beginErr is set: on a
	// pool, that is what returns its connection.
	tx pgx.Tx
	// beginErr is BEGIN's own error: the transaction did not start.
	beginErr error
	// then are statements sent in the same batch after the first one;
	// their results are read only when the first statement succeeded.
	then []pending
}

// pending is a statement queued behind a transaction's first statement:
// an Exec, or a QueryRow whose row is scanned into dest.
type pending struct {
	sql  string
	args []any
	dest []any // the row's destinations; nil for an Exec
	tag  pgconn.CommandTag
	// err is the statement's error, or the batch's when the statement
	// succeeded but the batch failed after it.
	err error
}

// read reads the statement's result from br.
func (s *pending) read(br pgx.BatchResults) {
	if s.dest == nil {
		s.tag, s.err = br.Exec()
		return
	}
	s.err = br.QueryRow().Scan(s.dest...)
}

// readPending reads the results of stmts, sent in order in one batch, from
// br. The server skips what follows a failed statement: those statements
// get its error. It returns the index of the first failed statement, or -1.
func readPending(br pgx.BatchResults, stmts []pending) int {
	for i := range stmts {
		stmts[i].read(br)
		if err := stmts[i].err; err != nil {
			for j := i + 1; j < len(stmts); j++ {
				stmts[j].err = err
			}
			return i
		}
	}
	return -1
}

var _ db.DBTX = (*beginFirst)(nil)

// send sends BEGIN, sql and b.then in one batch and hands sql's result to
// read. It returns BEGIN's error if BEGIN failed, and otherwise read's or
// the batch's; an error of one of b.then's statements is that statement's.
func (b *beginFirst) send(ctx context.Context, sql string, args []any, read func(pgx.BatchResults) error) error {
	batch := &pgx.Batch{}
	batch.BeginTx(b.opts)
	batch.Queue(sql, args...)
	for _, s := range b.then {
		batch.Queue(s.sql, s.args...)
	}
	br := b.sender.SendBatch(ctx, batch)
	b.tx = br.Tx()
	_, b.beginErr = br.Exec()
	var err error
	failed := -1
	if b.beginErr == nil {
		err = read(br)
		if err == nil {
			failed = readPending(br, b.then)
		}
	}
	cerr := br.Close()
	switch {
	case b.beginErr != nil:
		return b.beginErr
	case err != nil:
		return err
	case len(b.then) > 0:
		// The first statement succeeded; what failed after it (pgx's
		// batch reports the first error again on Close) is b.then's.
		if failed < 0 && cerr != nil {
			for i := range b.then {
				b.then[i].err = cerr
			}
		}
		return nil
	}
	return cerr
}

// Exec implements db.DBTX.
func (b *beginFirst) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if b.tx != nil {
		return b.tx.Exec(ctx, sql, args...)
	}
	var tag pgconn.CommandTag
	err := b.send(ctx, sql, args, func(br pgx.BatchResults) error {
		var err error
		tag, err = br.Exec()
		return err
	})
	return tag, err
}

// QueryRow implements db.DBTX. The statement is sent when the row is
// scanned, which sqlc-generated code does at once.
func (b *beginFirst) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if b.tx != nil {
		return b.tx.QueryRow(ctx, sql, args...)
	}
	return firstRow{b: b, ctx: ctx, sql: sql, args: args}
}

// Query implements db.DBTX. A multi-row result cannot be the pipelined first
// statement (its rows would outlive the batch), so Query is refused until a
// transaction has been begun.
func (b *beginFirst) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if b.tx != nil {
		return b.tx.Query(ctx, sql, args...)
	}
	return nil, errors.New("txhook: a multi-row query cannot be a transaction's pipelined first statement")
}

// firstRow is the row of a pipelined first statement.
type firstRow struct {
	b    *beginFirst
	ctx  context.Context
	sql  string
	args []any
}

// Scan sends the batch and scans the statement's row into dest. A second
// Scan is refused: the statement has run.
func (r firstRow) Scan(dest ...any) error {
	if r.b.tx != nil {
		return errors.New("txhook: the pipelined first statement's row was already scanned")
	}
	return r.b.send(r.ctx, r.sql, r.args, func(br pgx.BatchResults) error {
		return br.QueryRow().Scan(dest...)
	})
}

// beginWith begins a transaction on d and runs first in it. When d can
// pipeline (a pool or a connection), BEGIN and first's first statement share
// one round trip. The transaction is returned whenever it was begun, also
// when first failed (the caller rolls it back); a failure to begin is a
// *beginError.
func beginWith(ctx context.Context, d Beginner, opts pgx.TxOptions, first firstFunc) (pgx.Tx, error) {
	s := pipeliner(d)
	if s == nil || first == nil {
		tx, err := d.BeginTx(ctx, opts)
		if err != nil {
			return nil, &beginError{err: err}
		}
		if first == nil {
			return tx, nil
		}
		return tx, first(ctx, tx)
	}
	b := &beginFirst{sender: s, opts: opts}
	ferr := first(ctx, b)
	switch {
	case b.tx == nil:
		// Nothing was sent: first failed before its statement, or has none.
		if ferr == nil {
			ferr = errors.New("txhook: a transaction's first step ran no statement")
		}
		return nil, ferr
	case b.beginErr != nil:
		// Not begun. Rollback only hands the connection back to its pool.
		_ = b.tx.Rollback(context.WithoutCancel(ctx))
		return nil, &beginError{err: b.beginErr}
	}
	return b.tx, ferr
}
