package ghsweep

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// ErrRateLimited is matched (errors.Is) by a *RateLimitError.
var ErrRateLimited = errors.New("ghsweep: github rate limit reached")

// RateLimitError reports that GitHub's rate limit stopped a run: GitHub asked
// for a wait longer than Config.MaxRateLimitWait, or kept refusing after the
// waits it asked for.
type RateLimitError struct {
	// Request is the method and path refused, e.g. "GET /repos/o/r/hooks/1/deliveries".
	Request string
	// Until is when GitHub said requests may resume.
	Until time.Time
}

func (e *RateLimitError) Error() string {
	return fmt.Sprintf("ghsweep: github rate limit: %s refused until %s", e.Request, e.Until.UTC().Format(time.RFC3339))
}

// Is reports whether target is ErrRateLimited.
func (e *RateLimitError) Is(target error) bool { return target == ErrRateLimited }

// APIError is an answer of GitHub's REST API outside 2xx that is not a rate
// limit: a wrong hook, a token without the needed permission (401, 403,
// 404), a delivery too old to redeliver (422), or a server error (5xx).
type APIError struct {
	// Request is the method and path, e.g. "POST /repos/o/r/hooks/1/deliveries/2/attempts".
	Request string
	// StatusCode is the HTTP status of the answer.
	StatusCode int
	// Message is GitHub's "message" field, or the start of the body.
	Message string
	// DocumentationURL is GitHub's "documentation_url" field, if any.
	DocumentationURL string
}

func (e *APIError) Error() string {
	s := fmt.Sprintf("ghsweep: github: %s: %d %s", e.Request, e.StatusCode, http.StatusText(e.StatusCode))
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.StatusCode == http.StatusUnauthorized || e.StatusCode == http.StatusForbidden || e.StatusCode == http.StatusNotFound {
		s += " (check the token's permission on the hook, and the hook's owner and id; see docs/github-sweeper.md)"
	}
	return s
}

// fatal reports whether the error stops a run rather than one delivery:
// the credential or the hook is wrong, so every request would fail alike.
func (e *APIError) fatal() bool {
	return e.StatusCode == http.StatusUnauthorized || e.StatusCode == http.StatusForbidden
}

// delivery is one item of GitHub's "list deliveries for a webhook" answer
// (the fields the sweeper reads).
type delivery struct {
	ID          int64     `json:"id"`
	GUID        string    `json:"guid"`
	DeliveredAt time.Time `json:"delivered_at"`
	Redelivery  bool      `json:"redelivery"`
	Status      string    `json:"status"`
	StatusCode  int       `json:"status_code"`
	Event       string    `json:"event"`
}

// ok reports whether GitHub recorded the delivery as answered 2xx.
func (d delivery) ok() bool {
	return d.Status == "OK" || (d.StatusCode >= 200 && d.StatusCode < 300)
}

// client talks to GitHub's REST API: it authenticates, follows pagination,
// honours rate limits and never puts the credential in an error.
type client struct {
	http *http.Client
	base *url.URL
	// credential returns the bearer credential: the token, or a fresh App JWT.
	credential func() (string, error)
	// secret returns the texts to redact from errors (token, JWT).
	secret   func() []string
	maxWait  time.Duration
	pause    time.Duration
	now      func() time.Time
	resumeAt time.Time // set when GitHub said no requests are left until then
	lastPost time.Time
}

// maxAttempts bounds the tries of one request refused for its rate.
const maxAttempts = 4

// maxBody bounds the answer read from GitHub.
const maxBody = 32 << 20

// get decodes the JSON answer to GET u into out and returns the "next"
// page's URL from the Link header, or "".
func (c *client) get(ctx context.Context, u string, out any) (string, error) {
	h, err := c.do(ctx, http.MethodGet, u, out)
	if err != nil {
		return "", err
	}
	return c.nextLink(h.Get("Link"))
}

// post sends an empty POST to u, pausing first so that consecutive POSTs
// are at least c.pause apart (GitHub's advice against its secondary rate
// limits for requests that make content or cause work).
func (c *client) post(ctx context.Context, u string) error {
	if c.pause > 0 && !c.lastPost.IsZero() {
		if err := sleep(ctx, c.pause-c.now().Sub(c.lastPost)); err != nil {
			return err
		}
	}
	defer func() { c.lastPost = c.now() }()
	_, err := c.do(ctx, http.MethodPost, u, nil)
	return err
}

func (c *client) do(ctx context.Context, method, u string, out any) (http.Header, error) {
	reqName := method + " " + pathOf(u)
	for attempt := 1; ; attempt++ {
		if wait := c.resumeAt.Sub(c.now()); wait > 0 {
			if wait > c.maxWait {
				return nil, &RateLimitError{Request: reqName, Until: c.resumeAt}
			}
			if err := sleep(ctx, wait); err != nil {
				return nil, err
			}
		}
		cred, err := c.credential()
		if err != nil {
			return nil, err
		}
		req, err := http.NewRequestWithContext(ctx, method, u, nil)
		if err != nil {
			return nil, fmt.Errorf("ghsweep: new request %s: %w", reqName, err)
		}
		req.Header.Set("Authorization", "Bearer "+cred)
		req.Header.Set("Accept", "application/vnd.github+json")
		req.Header.Set("X-GitHub-Api-Version", "2022-11-28")
		req.Header.Set("User-Agent", "txhook-ghsweep")
		resp, err := c.http.Do(req)
		if err != nil {
			return nil, fmt.Errorf("ghsweep: github: %s: %w", reqName, errors.New(c.redact(err.Error())))
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("ghsweep: github: read answer to %s: %w", reqName, err)
		}
		now := c.now()
		reset := resetTime(resp.Header)
		if resp.Header.Get("X-RateLimit-Remaining") == "0" && !reset.IsZero() {
			c.resumeAt = reset
		}
		if resp.StatusCode >= 200 && resp.StatusCode < 300 {
			if out != nil && len(body) > 0 {
				if err := json.Unmarshal(body, out); err != nil {
					return nil, fmt.Errorf("ghsweep: github: decode answer to %s: %w", reqName, err)
				}
			}
			return resp.Header, nil
		}
		msg, doc := c.errorMessage(body)
		if rateLimited(resp, msg) {
			until := now.Add(time.Minute) // GitHub's advice when it names no time
			if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
				until = now.Add(time.Duration(s) * time.Second)
			} else if resp.Header.Get("X-RateLimit-Remaining") == "0" && !reset.IsZero() {
				until = reset
			}
			c.resumeAt = until
			if attempt >= maxAttempts || until.Sub(now) > c.maxWait {
				return nil, &RateLimitError{Request: reqName, Until: until}
			}
			continue
		}
		return nil, &APIError{Request: reqName, StatusCode: resp.StatusCode, Message: msg, DocumentationURL: doc}
	}
}

// rateLimited reports whether an answer is GitHub refusing for rate: 429,
// or 403 with no requests left, a Retry-After, or a message saying so.
func rateLimited(resp *http.Response, msg string) bool {
	switch resp.StatusCode {
	case http.StatusTooManyRequests:
		return true
	case http.StatusForbidden:
		return resp.Header.Get("X-RateLimit-Remaining") == "0" || resp.Header.Get("Retry-After") != "" ||
			strings.Contains(strings.ToLower(msg), "rate limit")
	}
	return false
}

// resetTime reads X-RateLimit-Reset (UTC epoch seconds), or the zero time.
func resetTime(h http.Header) time.Time {
	s, err := strconv.ParseInt(h.Get("X-RateLimit-Reset"), 10, 64)
	if err != nil || s <= 0 {
		return time.Time{}
	}
	return time.Unix(s, 0)
}

// maxMessage bounds, in bytes, the message of an answer outside 2xx that an
// error keeps.
const maxMessage = 500

// errorMessage reads GitHub's error body, {"message": ..., "documentation_url": ...},
// or takes the body itself when it is not that. The credential is redacted
// before the message is cut to maxMessage, so that a credential straddling
// the cut leaves nothing of itself; the message is made storable text.
func (c *client) errorMessage(body []byte) (msg, doc string) {
	var e struct {
		Message          string `json:"message"`
		DocumentationURL string `json:"documentation_url"`
	}
	if json.Unmarshal(body, &e) == nil && e.Message != "" {
		msg, doc = e.Message, e.DocumentationURL
	} else {
		msg = strings.TrimSpace(string(body))
	}
	return clip(c.redact(msg), maxMessage), clip(c.redact(doc), maxMessage)
}

// clip returns s as storable text (see storable), cut to n bytes.
func clip(s string, n int) string { return cut(storable(s), n) }

// cut returns s cut to at most n bytes at a character's start, with "..."
// when it was cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}

// storable returns s with what a PostgreSQL text value cannot hold, invalid
// UTF-8 and NUL bytes, replaced by U+FFFD.
func storable(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// redact removes the credential from s, should GitHub (or whatever answers
// at the API URL) echo it.
func (c *client) redact(s string) string {
	for _, sec := range c.secret() {
		if sec != "" {
			s = strings.ReplaceAll(s, sec, "[REDACTED]")
		}
	}
	return s
}

// sameOrigin reports whether u is on the origin of base: the same scheme,
// host and port (a missing port is the scheme's).
func sameOrigin(u, base *url.URL) bool {
	return strings.EqualFold(u.Scheme, base.Scheme) && strings.EqualFold(u.Hostname(), base.Hostname()) && port(u) == port(base)
}

func port(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	if strings.EqualFold(u.Scheme, "https") {
		return "443"
	}
	return "80"
}

// origin names u's origin, for errors.
func origin(u *url.URL) string { return u.Scheme + "://" + u.Host }

// originOnly returns a copy of hc whose redirects stay on base's origin: a
// redirect anywhere else is refused before anything is sent there, so the
// Authorization header goes nowhere else (net/http itself forwards it to
// the same host name on another port or scheme, and to subdomains). A
// redirect within the origin is left to hc's CheckRedirect, or to net/http's
// default policy when it has none.
func originOnly(hc *http.Client, base *url.URL) *http.Client {
	guarded := *hc
	check := hc.CheckRedirect
	guarded.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if !sameOrigin(req.URL, base) {
			return fmt.Errorf("redirect to %s refused: the credential goes to the API at %s only", origin(req.URL), origin(base))
		}
		if check != nil {
			return check(req, via)
		}
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
	return &guarded
}

// nextLink returns the URL of the Link header's rel="next", or "". It must
// be on the API's origin: the credential goes nowhere else.
func (c *client) nextLink(link string) (string, error) {
	for part := range strings.SplitSeq(link, ",") {
		target, params, ok := strings.Cut(strings.TrimSpace(part), ";")
		if !ok || !strings.HasPrefix(target, "<") || !strings.HasSuffix(target, ">") {
			continue
		}
		next := false
		for p := range strings.SplitSeq(params, ";") {
			if k, v, _ := strings.Cut(strings.TrimSpace(p), "="); k == "rel" && strings.Trim(v, `"`) == "next" {
				next = true
			}
		}
		if !next {
			continue
		}
		u, err := c.base.Parse(target[1 : len(target)-1])
		if err != nil {
			return "", fmt.Errorf("ghsweep: github: parse next page link: %w", err)
		}
		if !sameOrigin(u, c.base) {
			return "", fmt.Errorf("ghsweep: github: next page link points to %s, not to the API at %s", origin(u), origin(c.base))
		}
		return u.String(), nil
	}
	return "", nil
}

// pathOf returns u's path as it is sent, escaped, for errors (no query, no
// host).
func pathOf(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "?"
	}
	return p.EscapedPath()
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
