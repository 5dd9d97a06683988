package console

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook/admin"
)

// storeLargePayload stores a done GitHub push event, key "big-1", whose
// payload is a JSON document of at least 25 MiB (GitHub's limit), and
// returns the payload's size and SHA-256 (hex).
func storeLargePayload(t testing.TB, pool *pgxpool.Pool) (size int, sum string) {
	t.Helper()
	err := pool.QueryRow(t.Context(), `
		WITH p AS (
			SELECT convert_to('{"ref":"refs/heads/main","commits":[' || string_agg(
				'{"id":"' || md5(g::text) || '","message":"fix the thing number ' || g || ', "é" and <b>&amp;</b>"}', ',')
				|| ']}', 'UTF8') AS payload
			FROM generate_series(1, 252000) AS g
		)
		INSERT INTO txhook_processed_events (source, event_key, event_type, status, completed_at, payload)
		SELECT 'github', 'big-1', 'push', 'done', now(), payload FROM p
		RETURNING octet_length(payload), encode(sha256(payload), 'hex')`).Scan(&size, &sum)
	if err != nil {
		t.Fatal(err)
	}
	if size < 25<<20 {
		t.Fatalf("payload of %d bytes, want at least 25 MiB", size)
	}
	return size, sum
}

// allocated returns the bytes the process allocated while f ran.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// A 25 MiB payload: the event page shows its first 64 KiB and stays small;
// the whole payload is a download, streamed from the database a chunk at a
// time. Neither reads the payload whole into memory (it was: a 71 MB page,
// some 600 MiB allocated per view).
func TestLargePayload(t *testing.T) {
	c := setup(t, admin.Config{})
	size, sum := storeLargePayload(t, c.pool)

	var page string
	var code int
	alloc := allocated(func() {
		resp, err := http.Get(c.url + "/txhook/event?source=github&key=big-1")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		page, code = string(b), resp.StatusCode
	})
	if code != http.StatusOK {
		t.Fatalf("event page: %d\n%.2000s", code, page)
	}
	if len(page) > 512<<10 {
		t.Errorf("event page of %d bytes for a payload of %d, want at most 512 KiB", len(page), size)
	}
	// The bound is far above what a page of a 64 KiB preview allocates
	// (about 1.5 MiB), and far below one read of the payload whole.
	if alloc > 8<<20 {
		t.Errorf("the event page allocated %d MiB, want at most 8 MiB", alloc>>20)
	}
	for _, want := range []string{
		"Only the first 64", // KiB, or a few bytes less: the cut does not split a character
		fmt.Sprintf(" of %.1f MiB (%d bytes), as stored: ", float64(size)/(1<<20), size),
		`href="payload?key=big-1&amp;source=github"`,
		`&#34;ref&#34;:&#34;refs/heads/main&#34;`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("event page lacks %q", want)
		}
	}

	var got string
	var n int64
	var resp *http.Response
	alloc = allocated(func() {
		var err error
		resp, err = http.Get(c.url + "/txhook/payload?source=github&key=big-1")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		h := sha256.New()
		n, err = io.Copy(h, resp.Body)
		if err != nil {
			t.Fatalf("download: %v after %d bytes", err, n)
		}
		got = hex.EncodeToString(h.Sum(nil))
	})
	if resp.StatusCode != http.StatusOK || n != int64(size) || got != sum {
		t.Errorf("download: %d, %d bytes of SHA-256 %s; want 200, %d bytes of %s", resp.StatusCode, n, got, size, sum)
	}
	for name, want := range map[string]string{
		"Content-Type":           "application/octet-stream",
		"Content-Disposition":    `attachment; filename=github-big-1.json`,
		"Content-Length":         strconv.Itoa(size),
		"X-Content-Type-Options": "nosniff",
		"Cache-Control":          "no-store",
	} {
		if v := resp.Header.Get(name); v != want {
			t.Errorf("download: %s: %q, want %q", name, v, want)
		}
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Security-Policy"), "default-src 'none'") {
		t.Errorf("download: no Content-Security-Policy: %q", resp.Header.Get("Content-Security-Policy"))
	}
	// HEAD: the download's headers, without reading the payload.
	head, err := http.Head(c.url + "/txhook/payload?source=github&key=big-1")
	if err != nil {
		t.Fatal(err)
	}
	head.Body.Close()
	if head.StatusCode != http.StatusOK || head.ContentLength != int64(size) || head.Header.Get("Content-Disposition") == "" {
		t.Errorf("HEAD of the download: %d, length %d, %v", head.StatusCode, head.ContentLength, head.Header)
	}
	// The download holds one chunk (2 MiB) at a time: it allocates less than
	// the payload it sends, which a read of the payload whole allocates at
	// least once. (About 5 MiB; under the race detector some 12 MiB, since
	// sync.Pool then drops a quarter of what is put back, and the driver's
	// read buffer is allocated anew for a quarter of the chunks.)
	if alloc >= uint64(size) {
		t.Errorf("the download of %d MiB allocated %d MiB, want less than the payload", size>>20, alloc>>20)
	}
}

// An event deleted while its payload downloads (discarded, pruned): the
// download ends short of its announced length, which the client sees as a
// failed download, never as a whole one.
func TestPayloadDownloadOfAChangedEvent(t *testing.T) {
	c := setup(t, admin.Config{})
	size, _ := storeLargePayload(t, c.pool)
	resp, err := http.Get(c.url + "/txhook/payload?source=github&key=big-1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ContentLength != int64(size) {
		t.Fatalf("download: %d, length %d; want 200, %d", resp.StatusCode, resp.ContentLength, size)
	}
	// The first bytes have come; the rest cannot all be buffered on the way
	// (the sockets' buffers hold a few MiB): the server reads it after this.
	if _, err := io.ReadFull(resp.Body, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.pool.Exec(t.Context(), `DELETE FROM txhook_processed_events WHERE source = 'github' AND event_key = 'big-1'`); err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	if err == nil || n+1 >= int64(size) {
		t.Errorf("download of a deleted event: %d of %d bytes, error %v; want an error before the end", n+1, size, err)
	}
	if logs := c.logs.String(); !strings.Contains(logs, "payload download cut short") || !strings.Contains(logs, "changed during the download") {
		t.Errorf("the cut download is not logged:\n%s", logs)
	}
}
