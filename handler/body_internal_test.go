package handler

import (
	"bytes"
	"context"
	"errors"
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
	proc, err := txhook.NewProcessor(noTx{}, nil)
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

// TestReadBodyAllocations: a declared body costs one allocation of its
// size; an undeclared one grows, never past the limit.
func TestReadBodyAllocations(t *testing.T) {
	data := bytes.Repeat([]byte("x"), 3<<20)
	r := bytes.NewReader(nil)
	allocs := testing.AllocsPerRun(5, func() {
		r.Reset(data)
		b, err := readBody(r, int64(len(data)), 4<<20)
		if err != nil || len(b) != len(data) || cap(b) != len(data) {
			t.Fatalf("readBody = %d bytes (cap %d), %v", len(b), cap(b), err)
		}
	})
	if allocs != 1 {
		t.Errorf("declared body: %v allocations, want 1", allocs)
	}
	for _, size := range []int{0, 1, initialBodyBuffer, 3 << 20, 4 << 20} {
		r.Reset(data[:min(size, len(data))])
		if size > len(data) {
			r.Reset(bytes.Repeat([]byte("y"), size))
		}
		b, err := readBody(r, -1, 4<<20)
		if err != nil || len(b) != size || cap(b) > 4<<20 {
			t.Errorf("undeclared %d bytes: got %d (cap %d), %v", size, len(b), cap(b), err)
		}
	}
	r.Reset(bytes.Repeat([]byte("z"), 4<<20+1))
	if _, err := readBody(r, -1, 4<<20); !errors.As(err, new(*http.MaxBytesError)) {
		t.Errorf("undeclared body past the limit: %v, want *http.MaxBytesError", err)
	}
}
