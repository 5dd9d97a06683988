package admin_test

import (
	"context"
	"errors"
	"html"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
)

// Hostile values, as a sender (key, type, payload) or a handler's error
// (which may quote the payload) can put them in the events table.
const (
	hostileSource  = `"><svg onload=alert('source')>`
	hostileKey     = `"><img src=x onerror=alert('key')>`
	hostileType    = `<script>alert("type")</script>`
	hostileError   = `</td></pre><script>alert('error')</script>'><img src=x onerror=alert(1)>`
	hostileJSON    = `{"note":"</pre><script>alert('payload')</script>","x":"\"><img src=x onerror=alert(2)>"}`
	hostileText    = `<script>alert('text payload')</script><a href="javascript:alert(3)">x</a>`
	hostileMissing = `<script>alert('missing')</script>`
)

// TestHostileValuesRenderAsText renders hostile keys, sources, types,
// errors and payloads on every page of the console (overview, event lists,
// event pages, dead letters, the results of a replay and a discard, and an
// error page) and checks that each page holds only the elements of the
// console's own templates, no event-handler attribute and no script URL,
// and shows the hostile values as text.
func TestHostileValuesRenderAsText(t *testing.T) {
	t.Parallel()
	c := newConsole(t, hostileSource, map[string]txhook.HandlerFunc{
		hostileType: func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
			return txhook.Permanent(errors.New(hostileError + " in " + string(ev.Payload)))
		},
	})
	failedKey, claimedKey, doneKey := hostileKey, hostileKey+"-claimed", hostileKey+"-done"
	_, err := c.pool.Exec(t.Context(), `
		INSERT INTO txhook_processed_events (source, event_key, event_type, status, attempts, claimed_at,
		                                     lease_expires_at, completed_at, last_error, payload)
		VALUES ($1, $2, $5, 'failed', 1, now(), NULL, now(), $6, convert_to($7, 'UTF8')),
		       ($1, $3, $5, 'done', 1, now(), NULL, now(), NULL, convert_to($8, 'UTF8')),
		       ($1, $4, $5, 'in_progress', 2, now(), now() + interval '1 hour', NULL, $6, NULL)`,
		hostileSource, failedKey, doneKey, claimedKey, hostileType, hostileError, hostileJSON, hostileText)
	if err != nil {
		t.Fatal(err)
	}
	allowed := templateElements(t)
	eventPage := func(key string) string {
		return "event?" + url.Values{"source": {hostileSource}, "key": {key}}.Encode()
	}
	filtered := url.Values{"source": {hostileSource}, "type": {hostileType}, "since": {"7d"}}.Encode()

	pages := []struct {
		name, path string
		status     int
		want       []string // text the page must show
	}{
		{"overview", "", http.StatusOK, []string{hostileSource, claimedKey}},
		{"events", "events", http.StatusOK, []string{hostileSource, failedKey, doneKey, hostileType, hostileError}},
		{"events in flight", "events?status=in_progress", http.StatusOK, []string{claimedKey, hostileType, hostileError}},
		{"events filtered", "events?" + filtered, http.StatusOK, []string{failedKey, doneKey}},
		{"failed event", eventPage(failedKey), http.StatusOK, []string{hostileSource, failedKey, hostileType, hostileError,
			`"</pre><script>alert('payload')</script>"`, `"\"><img src=x onerror=alert(2)>"`}},
		{"done event, text payload", eventPage(doneKey), http.StatusOK, []string{doneKey, hostileText}},
		{"event in flight", eventPage(claimedKey), http.StatusOK, []string{claimedKey, hostileError}},
		{"dead letters", "dead-letters", http.StatusOK, []string{hostileSource, failedKey, hostileType, hostileError}},
		{"dead letters filtered", "dead-letters?" + filtered, http.StatusOK, []string{failedKey}},
		{"error page, no such event", "event?" + url.Values{"source": {hostileSource}, "key": {hostileMissing}}.Encode(),
			http.StatusNotFound, []string{"alert('missing')"}},
		{"error page, bad filter", "events?status=" + url.QueryEscape(hostileMissing), http.StatusBadRequest, []string{"alert('missing')"}},
	}
	var deadLetters string
	for _, p := range pages {
		code, body := c.get(p.path)
		if code != p.status {
			t.Errorf("%s (/%s): status %d, want %d: %s", p.name, p.path, code, p.status, body)
			continue
		}
		wantInert(t, p.name, body, allowed)
		wantText(t, p.name, body, p.want...)
		if p.name == "dead letters" {
			deadLetters = body
		}
	}

	// The results of a replay (the handler fails again, quoting the
	// payload) and of a discard refused (the event is in flight).
	code, body := c.post("replay", deadLetters, url.Values{"one": {formID(hostileSource, failedKey)}})
	if code != http.StatusOK {
		t.Fatalf("replay: status %d: %s", code, body)
	}
	wantInert(t, "replay result", body, allowed)
	wantText(t, "replay result", body, hostileSource, failedKey, hostileError, `"</pre><script>alert('payload')</script>"`)
	code, body = c.post("discard", deadLetters, url.Values{"ev": {formID(hostileSource, claimedKey), formID(hostileSource, failedKey)}})
	if code != http.StatusOK {
		t.Fatalf("discard: status %d: %s", code, body)
	}
	wantInert(t, "discard result", body, allowed)
	wantText(t, "discard result", body, hostileSource, claimedKey, failedKey)
}

// templateElements returns the names of the elements the console's
// templates write: every other element in a page came from the data.
func templateElements(t *testing.T) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("templates", "*.html"))
	if err != nil || len(files) == 0 {
		t.Fatalf("find the console's templates: %v", err)
	}
	names := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`</?([a-zA-Z][a-zA-Z0-9]*)`).FindAllStringSubmatch(string(b), -1) {
			names[strings.ToLower(m[1])] = true
		}
	}
	return names
}

// tag is one start or end tag of a page, with its attributes.
type tag struct {
	name  string
	attrs [][2]string // name, value
}

// scan splits page into its tags and its text (entities decoded), as a
// browser's tokenizer would for the markup html/template writes: every tag
// is closed by a '>' outside quotes, and every '<' of the data is escaped.
func scan(page string) (tags []tag, text string) {
	var b strings.Builder
	for len(page) > 0 {
		i := strings.IndexByte(page, '<')
		if i < 0 {
			b.WriteString(page)
			break
		}
		b.WriteString(page[:i])
		page = page[i+1:]
		if strings.HasPrefix(page, "!") { // doctype or comment
			if j := strings.IndexByte(page, '>'); j >= 0 {
				page = page[j+1:]
				continue
			}
			break
		}
		page = strings.TrimPrefix(page, "/")
		n := 0
		for n < len(page) && (isAlnum(page[n]) || page[n] == '-') {
			n++
		}
		tg := tag{name: strings.ToLower(page[:n])}
		page = page[n:]
		for {
			page = strings.TrimLeft(page, " \t\r\n/")
			if page == "" || page[0] == '>' {
				page = strings.TrimPrefix(page, ">")
				break
			}
			n := 0
			for n < len(page) && !strings.ContainsRune(" \t\r\n=>/", rune(page[n])) {
				n++
			}
			name, value := strings.ToLower(page[:n]), ""
			page = page[n:]
			if strings.HasPrefix(page, "=") {
				page = page[1:]
				if page != "" && (page[0] == '"' || page[0] == '\'') {
					q := page[0]
					end := strings.IndexByte(page[1:], q)
					if end < 0 {
						end = len(page) - 1
					}
					value, page = page[1:1+end], page[min(len(page), end+2):]
				} else {
					end := strings.IndexAny(page, " \t\r\n>")
					if end < 0 {
						end = len(page)
					}
					value, page = page[:end], page[end:]
				}
			}
			tg.attrs = append(tg.attrs, [2]string{name, html.UnescapeString(value)})
		}
		tags = append(tags, tg)
		b.WriteByte(' ')
	}
	return tags, html.UnescapeString(b.String())
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// pageText returns what page shows as text, each run of white space as
// one space.
func pageText(page string) string {
	_, text := scan(page)
	return strings.Join(strings.Fields(text), " ")
}

// wantInert fails t unless page holds only elements of allowed, no
// event-handler attribute (on…) and no link or form target with a scheme
// (javascript:, data:): hostile values in it stayed text or quoted
// attribute values.
func wantInert(t *testing.T, name, page string, allowed map[string]bool) {
	t.Helper()
	tags, _ := scan(page)
	if len(tags) == 0 {
		t.Errorf("%s: no markup at all", name)
	}
	for _, tg := range tags {
		if !allowed[tg.name] {
			t.Errorf("%s: element <%s>, which no template of the console writes: markup from the data", name, tg.name)
		}
		for _, a := range tg.attrs {
			if strings.HasPrefix(a[0], "on") {
				t.Errorf("%s: <%s> has the event handler attribute %s=%q", name, tg.name, a[0], a[1])
			}
			switch a[0] {
			case "href", "src", "action", "formaction":
				if u, err := url.Parse(strings.TrimSpace(a[1])); err != nil || u.Scheme != "" {
					t.Errorf("%s: <%s %s=%q>: a URL with a scheme (or none that parses)", name, tg.name, a[0], a[1])
				}
			}
		}
	}
}
