package handler

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
)

type noTx struct{}

func (noTx) BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error) {
	return nil, errors.New("no database")
}

// TestBodyDefaults: the limit and read deadline an endpoint applies when
// its Config leaves them zero.
func TestBodyDefaults(t *testing.T) {
	proc, err := txhook.NewProcessor(noTx{}, &txhook.Config{Routes: fallback("s")})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		p     Provider
		limit int64
	}{
		{&GitHub{Secrets: []string{"x"}}, 25 << 20},
		{&Shopify{Secrets: []string{"x"}}, 4 << 20},
		{&Stripe{Secrets: []string{"x"}}, DefaultMaxBodyBytes},
		{&StandardWebhooks{Secrets: []string{"whsec_c2VjcmV0LTE="}}, DefaultMaxBodyBytes},
	} {
		e, err := New(proc, &Config{Source: "s", Provider: tc.p})
		if err != nil {
			t.Fatal(err)
		}
		if e.maxBody != tc.limit || e.readWait != DefaultBodyReadTimeout {
			t.Errorf("%T: limit %d, read timeout %v; want %d, %v", tc.p, e.maxBody, e.readWait, tc.limit, DefaultBodyReadTimeout)
		}
	}
	e, err := New(proc, &Config{Source: "s", Provider: &GitHub{Secrets: []string{"x"}}, BodyReadTimeout: -1})
	if err != nil || e.readWait > 0 {
		t.Errorf("negative BodyReadTimeout: %v, %v; want no deadline", e.readWait, err)
	}
}

// TestReadBodyAllocations: a declared body within the first buffer costs
// one allocation of its size; a larger one, declared or not, grows as it
// arrives, never past its declared length or the limit, and a body at the
// limit is read whole while one byte more is too large.
func TestReadBodyAllocations(t *testing.T) {
	data := bytes.Repeat([]byte("x"), 4<<20+1)
	r := bytes.NewReader(nil)
	const small = 20 << 10
	allocs := testing.AllocsPerRun(5, func() {
		r.Reset(data[:small])
		b, err := readBody(r, small, 4<<20)
		if err != nil || len(b) != small || cap(b) != small {
			t.Fatalf("readBody = %d bytes (cap %d), %v", len(b), cap(b), err)
		}
	})
	if allocs != 1 {
		t.Errorf("declared %d-byte body: %v allocations, want 1", small, allocs)
	}
	for _, size := range []int{0, 1, undeclaredBodyBuffer, declaredBodyBuffer + 1, 3 << 20, 4 << 20} {
		for _, declared := range []int64{-1, int64(size)} {
			r.Reset(data[:size])
			b, err := readBody(r, declared, 4<<20)
			if err != nil || len(b) != size || cap(b) > 4<<20 || (declared >= 0 && cap(b) != size) {
				t.Errorf("%d bytes (declared %d): got %d (cap %d), %v", size, declared, len(b), cap(b), err)
			}
		}
	}
	for _, declared := range []int64{-1, 4 << 20} {
		r.Reset(data)
		b, err := readBody(http.MaxBytesReader(nil, io.NopCloser(r), 4<<20), declared, 4<<20)
		if declared < 0 && !errors.As(err, new(*http.MaxBytesError)) {
			t.Errorf("undeclared body past the limit: %v, want *http.MaxBytesError", err)
		}
		if declared >= 0 && (err != nil || len(b) != 4<<20) {
			// A declared length is what the server reads: the rest is
			// the next request's, not this body's.
			t.Errorf("declared body at the limit, followed by more: %d bytes, %v", len(b), err)
		}
	}
	r.Reset(data[:100])
	if _, err := readBody(r, 4<<20, 4<<20); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("body shorter than declared: %v, want io.ErrUnexpectedEOF", err)
	}
}

// fallback is a registry with one route: source's fallback, which writes
// nothing.
func fallback(source string) *txhook.Routes {
	rs := txhook.NewRoutes()
	rs.Transactional(source, "", func(context.Context, pgx.Tx, txhook.Event) error { return nil })
	return rs
}
