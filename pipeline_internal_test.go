package txhook

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
)

// downSender fails every batch before it reaches a server, as a pool that
// cannot connect does.
type downSender struct{ sent int }

var errDown = errors.New("database down")

func (s *downSender) SendBatch(_ context.Context, b *pgx.Batch) pgx.BatchResults {
	s.sent++
	return pgx.FailedBatchResults(b, errDown)
}

func TestBeginFirstReportsBeginErrorAndSendsOnce(t *testing.T) {
	s := &downSender{}
	b := &beginFirst{sender: s}
	row := b.QueryRow(t.Context(), "SELECT 1")
	var v int
	if err := row.Scan(&v); !errors.Is(err, errDown) {
		t.Fatalf("first scan: %v, want the send error", err)
	}
	if !errors.Is(b.beginErr, errDown) || b.tx == nil {
		t.Fatalf("beginErr %v, tx %v: want BEGIN's error and the (closed) transaction", b.beginErr, b.tx)
	}
	if err := b.tx.Rollback(t.Context()); !errors.Is(err, pgx.ErrTxClosed) {
		t.Errorf("rollback of a transaction never begun: %v, want ErrTxClosed", err)
	}
	if err := row.Scan(&v); err == nil {
		t.Error("second scan of the first statement's row succeeded")
	}
	if _, err := b.Query(t.Context(), "SELECT 1"); !errors.Is(err, pgx.ErrTxClosed) {
		t.Errorf("query after a failed begin: %v, want ErrTxClosed", err)
	}
	if s.sent != 1 {
		t.Errorf("batches sent = %d, want 1", s.sent)
	}
}
