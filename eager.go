package txhook

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNotNew is what a handler's statements return under
// Config.DedupeWithFirstStatement when the dedupe step, sent with the first
// of them, found the event's key already committed or held by another
// delivery. The transaction rolls back, and the delivery's outcome is the
// dedupe step's (duplicate or in flight) whatever the handler returns.
var ErrNotNew = errors.New("txhook: event key already committed or in flight; the transaction rolls back")

// lazyTx is the transaction a handler gets under
// Config.DedupeWithFirstStatement. Nothing is sent until the handler's
// first statement: BEGIN, the dedupe step and that statement then travel in
// one pgx batch. Its later statements run on the transaction begun, unless
// the key was not new or the dedupe step failed: they then return that
// error without being sent.
type lazyTx struct {
	p      *Processor
	ev     Event
	sender batchSender
	opts   pgx.TxOptions

	sent  bool       // the first batch was sent
	tx    pgx.Tx     // the transaction begun; set once sent
	b     beginFirst // sends the first batch
	first pending    // the handler's first statement, when pipelined
	// err is set when the key was not new (ErrNotNew, with res) or the
	// batch's BEGIN or dedupe step failed.
	err error
	res Result
}

var _ pgx.Tx = (*lazyTx)(nil)

// start sends BEGIN, the dedupe step and then (if not nil) in one round trip.
// It returns lt.err.
func (lt *lazyTx) start(ctx context.Context, then *pending) error {
	lt.b = beginFirst{sender: lt.sender, opts: lt.opts, then: then}
	b := &lt.b
	res, err := lt.p.dedupe(ctx, b, lt.ev)
	lt.sent, lt.tx = true, b.tx
	switch {
	case b.tx == nil:
		lt.err = errors.Join(errors.New("txhook: the dedupe step sent nothing"), err)
	case b.beginErr != nil:
		lt.err = &beginError{err: b.beginErr}
	case errors.Is(err, errRollback):
		lt.res, lt.err = res, ErrNotNew
	case err != nil:
		lt.err = err
	}
	return lt.err
}

// flush starts the transaction, if that has not happened yet, with no
// statement of the handler's: for the methods that cannot be pipelined.
func (lt *lazyTx) flush(ctx context.Context) error {
	if !lt.sent {
		return lt.start(ctx, nil)
	}
	return lt.err
}

// Exec implements pgx.Tx.
func (lt *lazyTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if lt.sent {
		if lt.err != nil {
			return pgconn.CommandTag{}, lt.err
		}
		return lt.tx.Exec(ctx, sql, args...)
	}
	lt.first = pending{sql: sql, args: args}
	if err := lt.start(ctx, &lt.first); err != nil {
		return pgconn.CommandTag{}, err
	}
	return lt.first.tag, lt.first.err
}

// QueryRow implements pgx.Tx. The first statement's row is sent when it is
// scanned, which sqlc-generated code does at once.
func (lt *lazyTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if lt.sent {
		if lt.err != nil {
			return errRow{lt.err}
		}
		return lt.tx.QueryRow(ctx, sql, args...)
	}
	return &lazyRow{lt: lt, ctx: ctx, sql: sql, args: args}
}

// lazyRow is the row of a handler's first statement.
type lazyRow struct {
	lt   *lazyTx
	ctx  context.Context
	sql  string
	args []any
}

// Scan sends the first batch, if another statement has not, and scans the
// statement's row into dest.
func (r *lazyRow) Scan(dest ...any) error {
	if r.lt.sent {
		return r.lt.QueryRow(r.ctx, r.sql, r.args...).Scan(dest...)
	}
	if dest == nil {
		dest = []any{} // a row scanned into nothing is still a row
	}
	lt := r.lt
	lt.first = pending{sql: r.sql, args: r.args, dest: dest}
	if err := lt.start(r.ctx, &lt.first); err != nil {
		return err
	}
	return lt.first.err
}

// errRow is a row whose Scan returns err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// Query implements pgx.Tx. Rows cannot outlive the first batch, so a query
// as the first statement is sent after it.
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
	return lt.tx.LargeObjects()
}

// Conn implements pgx.Tx. It begins the transaction first; when the key is
// not new, statements run on the connection are in a transaction that rolls
// back.
func (lt *lazyTx) Conn() *pgx.Conn {
	_ = lt.flush(context.Background())
	return lt.tx.Conn()
}

// Commit implements pgx.Tx. The processor commits only a transaction whose
// dedupe step found the key new.
func (lt *lazyTx) Commit(ctx context.Context) error {
	if !lt.sent {
		return errors.New("txhook: commit before the dedupe step was sent")
	}
	return lt.tx.Commit(ctx)
}

// Rollback implements pgx.Tx. A transaction never begun has nothing to roll
// back.
func (lt *lazyTx) Rollback(ctx context.Context) error {
	if lt.tx == nil {
		return nil
	}
	return lt.tx.Rollback(ctx)
}

// processEager is process under Config.DedupeWithFirstStatement: the
// handler runs at once in a lazyTx, and the dedupe step is sent with its
// first statement (or, when it sends none, after it returns).
func (p *Processor) processEager(ctx context.Context, s batchSender, ev Event, h HandlerFunc) (Result, error) {
	var lt *lazyTx
	begin := func(context.Context) (pgx.Tx, error) {
		lt = &lazyTx{p: p, ev: ev, sender: s, opts: p.txOpts.pgx()}
		return lt, nil
	}
	var res Result
	err := runTxWith(ctx, p.txOpts, begin, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		res, err = p.handleEager(ctx, lt, ev, h)
		return err
	}, func() { p.crash.at(CrashBeforeCommit) })
	return p.finish(ctx, ev, res, err)
}

// handleEager runs h in lt. The dedupe step's answer decides over h's: a key
// that is not new rolls back whatever h returned, and a failed dedupe step
// is the attempt's error (a serialization failure is then retried).
func (p *Processor) handleEager(ctx context.Context, lt *lazyTx, ev Event, h HandlerFunc) (Result, error) {
	herr := h(ctx, lt, ev)
	if lt.flush(ctx); lt.err != nil {
		if errors.Is(lt.err, ErrNotNew) {
			return lt.res, errRollback
		}
		return Result{}, lt.err
	}
	return p.handled(herr)
}
