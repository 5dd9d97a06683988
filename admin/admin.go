package admin

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"time"

	"github.com/txhook/txhook"
)

//go:embed templates/*.html templates/style.css
var assets embed.FS

// Config configures the console. The zero value (or nil) gives a read-only
// console with the defaults.
type Config struct {
	// AllowWrites enables Replay and Discard of dead letters. Defaults to
	// false: the console only reads, shows no write buttons and answers
	// every write 403.
	AllowWrites bool
	// Processor replays dead letters through its routes, the application's
	// handlers (txhook.Processor.Replay). Without it (the default) the
	// console offers Discard but not Replay.
	Processor *txhook.Processor
	// User returns the name of the user making a request (for example the
	// HTTP basic auth user that the application's middleware checked). It
	// is logged with every write, and the CSRF token of a page is valid for
	// that user only: a form (and its cookie) taken to another user's
	// requests is refused. Defaults to none: writes are logged as
	// "unknown", and a token is valid for whoever holds its cookie.
	User func(*http.Request) string
	// Logger receives a line for every write: who, what and the outcome.
	// Defaults to slog.Default().
	Logger *slog.Logger
	// HidePayloads keeps stored payloads, which may hold personal data, out
	// of the console: pages show only their size, and there is no download.
	// Handler errors often quote the payload they failed on, so they are
	// hidden too: an event's last error on the pages, and a replay's new
	// error on its result page and in the log of writes (txhook's own
	// reasons, such as a payload not stored, are still shown). Defaults to
	// false: payloads and errors are shown.
	HidePayloads bool
	// PageSize is the number of events on a page. Defaults to 50; at most
	// 500.
	PageSize int
	// QueryTimeout bounds the queries of one request (of a payload's
	// download: each chunk's query). Defaults to 10 s.
	QueryTimeout time.Duration
	// ChartHours is how many hours the overview's chart of events settled
	// per minute covers. Defaults to 3; at most 24.
	ChartHours int
	// CSRFKey signs the token that every write form carries (at least 32
	// bytes). Every instance serving the console behind one address needs
	// the same key: a form one instance rendered is refused by another
	// with a different key. Defaults to a random key per process, which
	// suits one instance (or sticky sessions).
	CSRFKey []byte
}

// Handler is the console, an http.Handler. Mount it with http.StripPrefix
// under a path of its own (see the package documentation). It is safe for
// concurrent use.
type Handler struct {
	db      txhook.Querier
	cfg     Config
	csrfKey []byte
	pages   map[string]*template.Template
	mux     *http.ServeMux
	cop     *http.CrossOriginProtection
}

// New returns the console for the events table in db (a *pgxpool.Pool, for
// example). It fails when db is nil or Config.CSRFKey is set but shorter
// than 32 bytes.
func New(db txhook.Querier, cfg *Config) (*Handler, error) {
	if db == nil {
		return nil, errors.New("admin: new console: nil database")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.PageSize <= 0 {
		c.PageSize = 50
	}
	c.PageSize = min(c.PageSize, 500)
	if c.QueryTimeout <= 0 {
		c.QueryTimeout = 10 * time.Second
	}
	if c.ChartHours <= 0 {
		c.ChartHours = 3
	}
	c.ChartHours = min(c.ChartHours, 24)
	key := c.CSRFKey
	switch {
	case len(key) == 0:
		key = make([]byte, 32)
		rand.Read(key) // never returns an error
	case len(key) < 32:
		return nil, errors.New("admin: new console: Config.CSRFKey is shorter than 32 bytes")
	}
	h := &Handler{db: db, cfg: c, csrfKey: key, pages: parsePages(), cop: http.NewCrossOriginProtection()}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", h.overview)
	mux.HandleFunc("GET /events", h.events)
	mux.HandleFunc("GET /event", h.event)
	mux.HandleFunc("GET /payload", h.payload)
	mux.HandleFunc("GET /dead-letters", h.deadLetters)
	mux.HandleFunc("POST /replay", h.replay)
	mux.HandleFunc("POST /discard", h.discard)
	mux.HandleFunc("GET /style.css", serveStyle)
	h.mux = mux
	return h, nil
}

// ServeHTTP serves the console's pages and writes.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "same-origin")
	w.Header().Set("Cache-Control", "no-store")
	h.mux.ServeHTTP(w, r)
}

func serveStyle(w http.ResponseWriter, r *http.Request) {
	b, err := assets.ReadFile("templates/style.css")
	if err != nil {
		http.Error(w, "no style sheet", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/css; charset=utf-8")
	w.Header().Set("Cache-Control", "max-age=3600")
	w.Write(b)
}

// The CSRF token is a signed double-submit cookie: the cookie holds a random
// value, and every form carries an HMAC of it and of the user that
// Config.User names, under a key that lives only in this Handler (or in
// Config.CSRFKey). A write must present both, from the same user. Over TLS
// the cookie is a __Host- cookie (Secure, Path=/, no Domain): no other
// host, and no plain-http page of this one, can set or replace it.
const (
	csrfCookie = "txhook_csrf"
	csrfField  = "csrf"
)

// csrfCookieName is the CSRF cookie's name for r: with the __Host- prefix
// over TLS, where the cookie is Secure; without it on plain http, where a
// browser would refuse a Secure (and so a __Host-) cookie.
func csrfCookieName(r *http.Request) string {
	if r.TLS != nil {
		return "__Host-" + csrfCookie
	}
	return csrfCookie
}

// csrfToken returns the form token for r, setting the cookie when r has
// none.
func (h *Handler) csrfToken(w http.ResponseWriter, r *http.Request) string {
	name := csrfCookieName(r)
	if c, err := r.Cookie(name); err == nil && len(c.Value) == 64 {
		return h.sign(r, c.Value)
	}
	b := make([]byte, 32)
	rand.Read(b)
	v := hex.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{
		Name: name, Value: v, Path: "/", HttpOnly: true,
		Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode,
	})
	return h.sign(r, v)
}

// sign returns the token for the cookie value v and the user making r.
func (h *Handler) sign(r *http.Request, v string) string {
	var user string
	if h.cfg.User != nil {
		user = h.cfg.User(r)
	}
	m := hmac.New(sha256.New, h.csrfKey)
	fmt.Fprintf(m, "%d:%s", len(user), user) // length-prefixed: user and value cannot run into each other
	m.Write([]byte(v))
	return hex.EncodeToString(m.Sum(nil))
}

// checkCSRF reports whether the POST r carries a valid token.
func (h *Handler) checkCSRF(r *http.Request) bool {
	if h.cop.Check(r) != nil {
		return false
	}
	c, err := r.Cookie(csrfCookieName(r))
	if err != nil || len(c.Value) != 64 {
		return false
	}
	got, err := hex.DecodeString(r.PostFormValue(csrfField))
	if err != nil {
		return false
	}
	want, _ := hex.DecodeString(h.sign(r, c.Value))
	return hmac.Equal(got, want)
}

// user names the user making r, for the log.
func (h *Handler) user(r *http.Request) string {
	if h.cfg.User != nil {
		if u := h.cfg.User(r); u != "" {
			return u
		}
	}
	return "unknown"
}
