package handler_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/handler"
)

// TestDefaultBodyLimits: each provider's endpoint refuses an unsigned body
// past its documented maximum with 413 before reading it, and reads one at
// the limit (then refuses its signature), declared or chunked.
func TestDefaultBodyLimits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		p     handler.Provider
		limit int64
	}{
		{"github", &handler.GitHub{Secrets: []string{"gh"}}, 25 << 20},
		{"shopify", &handler.Shopify{Secrets: []string{"shp"}}, 4 << 20},
		{"stripe", &handler.Stripe{Secrets: []string{"whsec_x"}}, 1 << 20},
		{"standard", &handler.StandardWebhooks{Secrets: []string{"whsec_c2VjcmV0LTE="}}, 1 << 20},
		{"hmac", &handler.HMAC{Secrets: []string{"h"}, SignatureHeader: "X-Sig", KeyField: "id"}, handler.DefaultMaxBodyBytes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			proc, err := txhook.NewProcessor(stubBeginner{}, fallbackOnly("s"))
			if err != nil {
				t.Fatal(err)
			}
			ep, err := handler.New(proc, &handler.Config{Source: "s", Provider: tc.p, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				size     int64
				declared bool
				want     int
			}{
				{tc.limit, true, http.StatusBadRequest},
				{tc.limit + 1, true, http.StatusRequestEntityTooLarge},
				{tc.limit, false, http.StatusBadRequest},
				{tc.limit + 1, false, http.StatusRequestEntityTooLarge},
			} {
				req := httptest.NewRequest(http.MethodPost, "/", io.LimitReader(zeros{}, c.size))
				req.ContentLength = -1
				if c.declared {
					req.ContentLength = c.size
				}
				w := httptest.NewRecorder()
				ep.ServeHTTP(w, req)
				if w.Code != c.want {
					t.Errorf("%d bytes (declared %v): status %d, want %d", c.size, c.declared, w.Code, c.want)
				}
			}
		})
	}
}

// TestDeclaredLengthNotAllocatedUpFront: a request declaring a large body
// but sending little costs memory for what arrives, not for what it
// declares, so headers alone cannot pin the limit per connection while the
// body is awaited.
func TestDeclaredLengthNotAllocatedUpFront(t *testing.T) {
	proc, err := txhook.NewProcessor(stubBeginner{}, fallbackOnly("gh"))
	if err != nil {
		t.Fatal(err)
	}
	const declared = 16 << 20
	ep, err := handler.New(proc, &handler.Config{Source: "gh", Provider: &handler.GitHub{Secrets: []string{"gh"}},
		MaxBodyBytes: declared, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	const runs = 5
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		req := httptest.NewRequest(http.MethodPost, "/", io.LimitReader(zeros{}, 1000))
		req.ContentLength = declared
		w := httptest.NewRecorder()
		ep.ServeHTTP(w, req)
		if w.Code != http.StatusBadRequest {
			t.Fatalf("short body: status %d, want 400", w.Code)
		}
	}
	runtime.ReadMemStats(&after)
	if grew := (after.TotalAlloc - before.TotalAlloc) / runs; grew > declared/64 {
		t.Errorf("a request declaring %d bytes and sending 1000 allocated %d bytes, want far less than declared", declared, grew)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestBodyReadDeadline: a body trickling in is cut off after
// BodyReadTimeout, not read for as long as the sender keeps sending.
func TestBodyReadDeadline(t *testing.T) {
	t.Parallel()
	proc, err := txhook.NewProcessor(stubBeginner{}, fallbackOnly("gh"))
	if err != nil {
		t.Fatal(err)
	}
	gh := &handler.GitHub{Secrets: []string{"gh"}}
	ep, err := handler.New(proc, &handler.Config{Source: "gh", Provider: gh, BodyReadTimeout: 200 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(ep)
	t.Cleanup(srv.Close)
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	// 1,000 bytes at one byte per 50ms would take 50s to send.
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\nX-GitHub-Delivery: d\r\nX-GitHub-Event: push\r\n\r\n")
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for range 1000 {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if _, err := conn.Write([]byte("x")); err != nil {
				return
			}
		}
	}()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer within 10s while the body trickled in: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Errorf("status %d, want 408", resp.StatusCode)
	}
	// The server then closes the connection: the next read ends, with EOF
	// or, when the trickling client's write crossed the close, a reset.
	if b, err := br.ReadByte(); err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("read after the answer: %q, %v; want the connection closed", b, err)
	}
}
