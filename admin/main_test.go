package admin_test

import (
	"context"
	"encoding/base64"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/admin"
	"github.com/txhook/txhook/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// console is one test's console, served over HTTP on a database of its own
// with a ledger table that the replay handler writes to, and a client that
// keeps the console's cookie, as a browser does.
type console struct {
	t      *testing.T
	pool   *pgxpool.Pool
	url    string
	client *http.Client
}

// newConsole serves a console that allows writes and replays through
// source's handlers (by event type).
func newConsole(t *testing.T, source string, handlers map[string]txhook.HandlerFunc) *console {
	t.Helper()
	d := testdb.New(t)
	if _, err := d.Pool.Exec(t.Context(), `CREATE TABLE ledger (event_key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	routes := txhook.NewRoutes()
	for typ, h := range handlers {
		routes.Transactional(source, typ, h)
	}
	proc, err := txhook.NewProcessor(d.Pool, &txhook.Config{Routes: routes})
	if err != nil {
		t.Fatal(err)
	}
	h, err := admin.New(d.Pool, &admin.Config{
		AllowWrites: true,
		Processor:   proc,
		Logger:      slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &console{t: t, pool: d.Pool, url: srv.URL, client: &http.Client{Jar: jar}}
}

// addToLedger is a replay handler with one business write.
func addToLedger(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
	_, err := tx.Exec(ctx, "INSERT INTO ledger (event_key) VALUES ($1)", ev.Key)
	return err
}

// get fetches the console page at path and returns its status and body.
func (c *console) get(path string) (int, string) {
	c.t.Helper()
	resp, err := c.client.Get(c.url + "/" + path)
	if err != nil {
		c.t.Fatal(err)
	}
	return readAll(c.t, resp)
}

// post sends form to the console's write at path with the CSRF token of
// page, a page the console rendered for this client (a form submitted from
// it), and returns the answer's status and body.
func (c *console) post(path, page string, form url.Values) (int, string) {
	c.t.Helper()
	m := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindStringSubmatch(page)
	if m == nil {
		c.t.Fatal("the page has no form with a CSRF token")
	}
	form.Set("csrf", m[1])
	resp, err := c.client.PostForm(c.url+"/"+path, form)
	if err != nil {
		c.t.Fatal(err)
	}
	return readAll(c.t, resp)
}

func readAll(t *testing.T, resp *http.Response) (int, string) {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// status returns the status of the event's row, or "absent".
func (c *console) status(source, key string) string {
	c.t.Helper()
	var s string
	err := c.pool.QueryRow(c.t.Context(), "SELECT status FROM txhook_processed_events WHERE source = $1 AND event_key = $2",
		source, key).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return "absent"
	}
	if err != nil {
		c.t.Fatal(err)
	}
	return s
}

// ledger returns how often the event was applied.
func (c *console) ledger(key string) int {
	c.t.Helper()
	var n int
	if err := c.pool.QueryRow(c.t.Context(), "SELECT count(*) FROM ledger WHERE event_key = $1", key).Scan(&n); err != nil {
		c.t.Fatal(err)
	}
	return n
}

// formID is how the console's forms name an event (the value of an "ev"
// box or a row's "one" button).
func formID(source, key string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(source)) + "." + base64.RawURLEncoding.EncodeToString([]byte(key))
}

// wantText fails t unless page's text (its markup removed and entities
// decoded) holds every one of want.
func wantText(t *testing.T, name, page string, want ...string) {
	t.Helper()
	text := pageText(page)
	for _, w := range want {
		if !strings.Contains(text, w) {
			t.Errorf("%s: the page's text lacks %q", name, w)
		}
	}
}
