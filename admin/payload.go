package admin

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/txhook/txhook/db"
)

// previewBytes bounds how much of a payload the event page shows: the page
// stays small (a few hundred kB at most, escaped) whatever the payload's
// size, and the whole payload is a download.
const previewBytes = 64 << 10

// downloadChunk is how much of a payload one query of a download reads: a
// download holds one chunk in memory, whatever the payload's size. Each
// query of a compressed payload decompresses it from its start to the
// chunk's end, so smaller chunks cost the database more: 25 MiB of JSON
// took 0.8 s in chunks of 1 MiB, 0.4 s in chunks of 2 MiB. The row of a
// chunk fits the database driver's 2 MiB read buffer.
const downloadChunk = 2<<20 - 64

// payloadChunk reads $5 bytes of an event's payload from byte $4 (from 1),
// through the primary key. It finds no row when the event is no longer the
// one whose download began: deleted (discarded, pruned), delivered anew
// under the same key (created_at differs) or its payload dropped (the size
// differs; a stored payload never changes otherwise). It is not in
// queries/: sqlc's code would scan each chunk into a new slice, where
// payloadChunkBuffer reuses one.
const payloadChunk = `SELECT substring(payload FROM $4::integer FOR $5::integer)
FROM txhook_processed_events
WHERE source = $1 AND event_key = $2 AND created_at = $3 AND octet_length(payload) = $6`

// errPayloadChanged: the event is no longer the one whose download began.
var errPayloadChanged = errors.New("the event changed during the download (discarded, pruned or delivered anew): download it again")

// payloadChunkBuffer receives a chunk from the driver's memory
// (pgtype.BytesScanner) into a buffer reused for the next one.
type payloadChunkBuffer struct{ b []byte }

func (c *payloadChunkBuffer) ScanBytes(v []byte) error {
	c.b = append(c.b[:0], v...)
	return nil
}

// payloadURL is the address of an event's payload download.
func payloadURL(source, key string) string {
	return "payload?" + url.Values{"source": {source}, "key": {key}}.Encode()
}

// payload serves an event's whole payload as a download: never rendered
// (application/octet-stream, attachment, and the console's nosniff and
// Content-Security-Policy headers), read from the database one chunk at a
// time and written out as it comes, with its length announced first. A
// download cut short by a failed query ends short of that length, which the
// client reports as a failed download.
func (h *Handler) payload(w http.ResponseWriter, r *http.Request) {
	if h.cfg.HidePayloads {
		h.fail(w, r, http.StatusForbidden, errors.New("payloads are hidden by the console's configuration (admin.Config.HidePayloads)"))
		return
	}
	source, key := r.FormValue("source"), r.FormValue("key")
	ctx, cancel := h.ctx(r)
	e, err := db.New(h.db).AdminEvent(ctx, db.AdminEventParams{Source: source, EventKey: key, PreviewBytes: 0})
	cancel()
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		h.fail(w, r, http.StatusNotFound, fmt.Errorf("no event with source %q and key %q (never delivered, or pruned)", source, key))
		return
	case err != nil:
		h.fail(w, r, http.StatusInternalServerError, fmt.Errorf("read event: %w", err))
		return
	case !e.HasPayload:
		h.fail(w, r, http.StatusNotFound, fmt.Errorf("the payload of %s/%s is not stored", source, key))
		return
	}
	size := int(e.PayloadSize)
	var buf payloadChunkBuffer
	sent := false
	for off := 0; off < size; off += len(buf.b) {
		if err := h.readChunk(r, &buf, source, key, e.CreatedAt, size, off, min(downloadChunk, size-off)); err != nil {
			switch {
			case r.Context().Err() != nil:
				// The client went away.
			case !sent && errors.Is(err, errPayloadChanged):
				h.fail(w, r, http.StatusNotFound, err)
			case !sent:
				h.fail(w, r, http.StatusInternalServerError, err)
			default:
				h.cfg.Logger.Error("txhook console: payload download cut short", "source", source, "key", key, "sent", off, "size", size, "err", err)
			}
			return
		}
		if !sent {
			payloadHeaders(w, source, key, size, buf.b)
			sent = true
			if r.Method == http.MethodHead {
				return
			}
		}
		if _, err := w.Write(buf.b); err != nil {
			return // the client went away
		}
	}
	if !sent {
		payloadHeaders(w, source, key, 0, nil)
	}
}

// readChunk reads n bytes from off into buf, of the payload of size bytes
// of the event source/key created at createdAt, under the console's query
// timeout.
func (h *Handler) readChunk(r *http.Request, buf *payloadChunkBuffer, source, key string, createdAt pgtype.Timestamptz, size, off, n int) error {
	ctx, cancel := h.ctx(r)
	defer cancel()
	err := h.db.QueryRow(ctx, payloadChunk, source, key, createdAt, off+1, n, size).Scan(buf)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("read payload of %s/%s: %w", source, key, errPayloadChanged)
	case err != nil:
		return fmt.Errorf("read payload: %w", err)
	case len(buf.b) != n:
		return fmt.Errorf("read payload: %d bytes at %d, want %d", len(buf.b), off, n)
	}
	return nil
}

// payloadHeaders starts the answer of a download of size bytes; first is
// the payload's first chunk, which names the file's extension.
func payloadHeaders(w http.ResponseWriter, source, key string, size int, first []byte) {
	ext := ".bin"
	if t := bytes.TrimLeft(first, " \t\r\n"); len(t) > 0 && (t[0] == '{' || t[0] == '[') {
		ext = ".json"
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": downloadName(source, key) + ext}))
	h.Set("Content-Length", strconv.Itoa(size))
	w.WriteHeader(http.StatusOK)
}

// downloadName is a file name for an event's payload: its source and key,
// with every character but ASCII letters, digits, '.', '-' and '_' replaced
// by '_', and at most 100 bytes long.
func downloadName(source, key string) string {
	name := []byte(source + "-" + key)
	for i, c := range name {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '-' || c == '_') {
			name[i] = '_'
		}
	}
	return strings.TrimLeft(string(name[:min(len(name), 100)]), ".")
}

// showPayload returns what the event page shows of a payload of size bytes
// from its start p (all of it when it is small): the text, a note on the
// payload's size and form, and when p is not all of it, a sentence saying
// so. A whole JSON payload is indented; a cut one is shown as stored.
func showPayload(p []byte, size int) (text, note, cut string) {
	if len(p) == size {
		var b bytes.Buffer
		if json.Valid(p) && json.Indent(&b, p, "", "  ") == nil {
			return b.String(), byteSize(size) + ", JSON", ""
		}
		if utf8.Valid(p) {
			return string(p), byteSize(size) + ", text", ""
		}
		return base64.StdEncoding.EncodeToString(p), byteSize(size) + ", binary (shown in base64)", ""
	}
	// The cut may split a character: the start of one may end p.
	t := p
	for i := 1; i < utf8.UTFMax && i <= len(p); i++ {
		if utf8.RuneStart(p[len(p)-i]) {
			if !utf8.FullRune(p[len(p)-i:]) {
				t = p[:len(p)-i]
			}
			break
		}
	}
	if utf8.Valid(t) {
		return string(t), byteSize(size), "Only the first " + byteSize(len(t)) + " of " + byteSize(size) + ", as stored"
	}
	return base64.StdEncoding.EncodeToString(p), byteSize(size) + ", binary",
		"Only the first " + byteSize(len(p)) + " of " + byteSize(size) + ", in base64"
}

// byteSize formats n bytes for a reader: 76 bytes, 64 KiB, 25.0 MiB
// (26214400 bytes).
func byteSize(n int) string {
	switch {
	case n == 1:
		return "1 byte"
	case n < 1<<10:
		return fmt.Sprintf("%d bytes", n)
	case n%(1<<10) == 0 && n < 1<<20:
		return fmt.Sprintf("%d KiB", n>>10)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB (%d bytes)", float64(n)/(1<<10), n)
	}
	return fmt.Sprintf("%.1f MiB (%d bytes)", float64(n)/(1<<20), n)
}
