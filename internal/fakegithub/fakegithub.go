// Package fakegithub is a local stand-in for the part of GitHub's REST API
// that lists a webhook's deliveries and redelivers one, shaped from GitHub's
// documented requests and answers: bearer authentication (a token, or a
// GitHub App's RS256 JSON Web Token), cursor pagination through the Link
// header, the x-ratelimit-* headers with primary (403) and secondary (429 +
// Retry-After) rate limits, and error bodies {"message", "documentation_url"}.
//
// It also plays GitHub's sending side: Send delivers a webhook to a real
// receiver, signed with X-Hub-Signature-256 as GitHub signs it, and records
// the delivery as OK or failed from the answer; a redelivery request sends
// the same body under the same guid again and records that attempt.
package fakegithub

import (
	"bytes"
	"context"
	"crypto"
	"crypto/hmac"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Config configures a Server.
type Config struct {
	// Hook is the hook's API path without the leading slash, as
	// ghsweep.Hook.String names it: "repos/OWNER/REPO/hooks/ID",
	// "orgs/ORG/hooks/ID" or "app/hook".
	Hook string
	// Token is the bearer token accepted for repository and organization
	// hooks.
	Token string
	// AppID and AppKey verify the JSON Web Token of an App hook.
	AppID  string
	AppKey *rsa.PublicKey
	// Target is the receiver's URL; Secret signs what is sent there.
	Target string
	Secret string
	// Timeout bounds a delivery to Target, as GitHub's 10 seconds do.
	// Defaults to 10s.
	Timeout time.Duration
	// Window is how old a delivery may be and still be redelivered.
	// Defaults to 72h.
	Window time.Duration
}

// Delivery is one attempt at delivering an event, as GitHub lists it.
type Delivery struct {
	ID          int64     `json:"id"`
	GUID        string    `json:"guid"`
	DeliveredAt time.Time `json:"delivered_at"`
	Redelivery  bool      `json:"redelivery"`
	Duration    float64   `json:"duration"`
	Status      string    `json:"status"`
	StatusCode  int       `json:"status_code"`
	Event       string    `json:"event"`
	Action      *string   `json:"action"`
	// InstallationID and RepositoryID are null for a repository hook.
	InstallationID *int64 `json:"installation_id"`
	RepositoryID   *int64 `json:"repository_id"`
	// ThrottledAt is null unless GitHub throttled the delivery.
	ThrottledAt *time.Time `json:"throttled_at"`
}

// Server is the fake API. It is an http.Handler.
type Server struct {
	cfg    Config
	client *http.Client

	mu         sync.Mutex
	nextID     int64
	deliveries []Delivery // ascending id
	bodies     map[string]event
	attempts   []string // guids whose redelivery was requested, in order
	limit      int      // primary limit per window; 0: none
	remaining  int
	reset      time.Time
	period     time.Duration
	secondary  int // next requests answered 429
	retryAfter int
	redirects  int    // next requests answered with a redirect
	redirCode  int    // its status
	redirTo    string // its target, followed by the request's path and query
	requests   int
	auths      []string // Authorization headers seen
	wg         sync.WaitGroup
}

type event struct {
	name string
	body []byte
}

// New returns a Server.
func New(cfg Config) *Server {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Window <= 0 {
		cfg.Window = 72 * time.Hour
	}
	return &Server{
		cfg:    cfg,
		client: &http.Client{Timeout: cfg.Timeout},
		nextID: 1_000_000_000,
		bodies: map[string]event{},
	}
}

// Add records a delivery as if GitHub had made it. A zero ID gets the next
// id; a zero DeliveredAt is now. It returns the delivery as recorded.
func (s *Server) Add(d Delivery) Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addLocked(d)
}

func (s *Server) addLocked(d Delivery) Delivery {
	if d.ID == 0 {
		s.nextID++
		d.ID = s.nextID
	}
	s.nextID = max(s.nextID, d.ID)
	if d.DeliveredAt.IsZero() {
		d.DeliveredAt = time.Now().UTC()
	}
	if d.Status == "" {
		d.Status = statusText(d.StatusCode, nil)
	}
	i, _ := slices.BinarySearchFunc(s.deliveries, d.ID, func(e Delivery, id int64) int { return int(min(max(e.ID-id, -1), 1)) })
	s.deliveries = slices.Insert(s.deliveries, i, d)
	return d
}

// Send delivers the event to Target once, as GitHub does, and records the
// attempt. The receiver's answer decides its status; a connection error or
// a timeout is a failed delivery, not an error. It returns the recorded
// delivery.
func (s *Server) Send(ctx context.Context, guid, eventName string, body []byte) Delivery {
	s.mu.Lock()
	s.bodies[guid] = event{eventName, body}
	s.mu.Unlock()
	return s.send(ctx, guid, false)
}

func (s *Server) send(ctx context.Context, guid string, redelivery bool) Delivery {
	s.mu.Lock()
	ev := s.bodies[guid]
	s.mu.Unlock()
	start := time.Now()
	code, err := s.post(ctx, guid, ev)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addLocked(Delivery{
		GUID: guid, Event: ev.name, Redelivery: redelivery, DeliveredAt: start.UTC(),
		Duration: time.Since(start).Seconds(), StatusCode: code, Status: statusText(code, err),
	})
}

// post sends one signed delivery and returns the answer's status.
func (s *Server) post(ctx context.Context, guid string, ev event) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.cfg.Target, bytes.NewReader(ev.body))
	if err != nil {
		return 0, err
	}
	mac := hmac.New(sha256.New, []byte(s.cfg.Secret))
	mac.Write(ev.body)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "GitHub-Hookshot/fake")
	req.Header.Set("X-GitHub-Event", ev.name)
	req.Header.Set("X-GitHub-Delivery", guid)
	req.Header.Set("X-GitHub-Hook-ID", "1")
	req.Header.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(mac.Sum(nil)))
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = bytes.NewBuffer(nil).ReadFrom(resp.Body)
	return resp.StatusCode, nil
}

func statusText(code int, err error) string {
	switch {
	case err != nil && strings.Contains(err.Error(), "Timeout"):
		return "timed out"
	case err != nil:
		return "failed to connect to host"
	case code >= 200 && code < 300:
		return "OK"
	}
	return fmt.Sprintf("Invalid HTTP Response: %d", code)
}

// Deliveries returns the recorded deliveries, oldest first.
func (s *Server) Deliveries() []Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.deliveries)
}

// Redeliveries returns the guids whose redelivery was requested, in the
// order of the requests.
func (s *Server) Redeliveries() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.attempts)
}

// Requests returns the number of API requests served.
func (s *Server) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// Wait waits until the redeliveries requested so far have been sent.
func (s *Server) Wait() { s.wg.Wait() }

// SetRateLimit limits the API to limit requests until reset; after reset
// the allowance is limit again, for another period as long. 0 means no
// limit.
func (s *Server) SetRateLimit(limit int, reset time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// GitHub announces the reset in whole seconds.
	if r := reset.Truncate(time.Second); r.Before(reset) {
		reset = r.Add(time.Second)
	}
	s.limit, s.remaining, s.reset, s.period = limit, limit, reset, max(time.Until(reset), time.Second)
}

// SecondaryLimit answers the next n requests 429 with Retry-After seconds.
func (s *Server) SecondaryLimit(n, retryAfter int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.secondary, s.retryAfter = n, retryAfter
}

// Redirect answers the next n requests with code (301, 302, 307, 308) and a
// Location of to followed by the request's path and query, as GitHub
// answers a request for a renamed repository; to may be another server.
func (s *Server) Redirect(n, code int, to string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.redirects, s.redirCode, s.redirTo = n, code, strings.TrimSuffix(to, "/")
}

// ServeHTTP serves GET /{hook}/deliveries and POST
// /{hook}/deliveries/{id}/attempts.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.requests++
	s.auths = append(s.auths, r.Header.Get("Authorization"))
	if s.redirects > 0 {
		s.redirects--
		to, code := s.redirTo+r.URL.RequestURI(), s.redirCode
		s.mu.Unlock()
		http.Redirect(w, r, to, code)
		return
	}
	if s.secondary > 0 {
		s.secondary--
		w.Header().Set("Retry-After", strconv.Itoa(s.retryAfter))
		s.mu.Unlock()
		writeError(w, http.StatusTooManyRequests, "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.")
		return
	}
	if s.limit > 0 {
		if now := time.Now(); !now.Before(s.reset) {
			s.remaining = s.limit
			s.reset = now.Add(s.period).Truncate(time.Second).Add(time.Second)
		}
		h := w.Header()
		h.Set("X-RateLimit-Limit", strconv.Itoa(s.limit))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(s.reset.Unix(), 10))
		h.Set("X-RateLimit-Resource", "core")
		if s.remaining == 0 {
			h.Set("X-RateLimit-Remaining", "0")
			h.Set("X-RateLimit-Used", strconv.Itoa(s.limit))
			s.mu.Unlock()
			writeError(w, http.StatusForbidden, "API rate limit exceeded for user ID 1.")
			return
		}
		s.remaining--
		h.Set("X-RateLimit-Remaining", strconv.Itoa(s.remaining))
		h.Set("X-RateLimit-Used", strconv.Itoa(s.limit-s.remaining))
	}
	s.mu.Unlock()
	if !s.authorized(r.Header.Get("Authorization")) {
		writeError(w, http.StatusUnauthorized, "Bad credentials")
		return
	}
	prefix := "/" + s.cfg.Hook + "/deliveries"
	rest, ok := strings.CutPrefix(r.URL.Path, prefix)
	switch {
	case ok && rest == "" && r.Method == http.MethodGet:
		s.list(w, r)
	case ok && strings.HasSuffix(rest, "/attempts") && r.Method == http.MethodPost:
		id, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(rest, "/"), "/attempts"), 10, 64)
		if err != nil {
			writeError(w, http.StatusNotFound, "Not Found")
			return
		}
		s.redeliver(w, id)
	default:
		writeError(w, http.StatusNotFound, "Not Found")
	}
}

// list answers a page, newest first, from the cursor (a delivery id) on.
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	perPage := 30
	if v := r.URL.Query().Get("per_page"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			writeError(w, http.StatusBadRequest, "per_page must be a positive integer")
			return
		}
		perPage = min(n, 100)
	}
	start := int64(1<<63 - 1)
	if c := r.URL.Query().Get("cursor"); c != "" {
		n, err := strconv.ParseInt(strings.TrimPrefix(c, "v1_"), 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid cursor")
			return
		}
		start = n
	}
	s.mu.Lock()
	page := []Delivery{}
	var next int64
	for i := len(s.deliveries) - 1; i >= 0; i-- {
		d := s.deliveries[i]
		if d.ID > start {
			continue
		}
		if len(page) == perPage {
			next = d.ID
			break
		}
		page = append(page, d)
	}
	s.mu.Unlock()
	if next != 0 {
		u := *r.URL
		u.Scheme, u.Host = "http", r.Host
		q := u.Query()
		q.Set("per_page", strconv.Itoa(perPage))
		q.Set("cursor", "v1_"+strconv.FormatInt(next, 10))
		u.RawQuery = q.Encode()
		w.Header().Set("Link", fmt.Sprintf(`<%s>; rel="next"`, u.String()))
	}
	writeJSON(w, http.StatusOK, page)
}

// redeliver records the request and, with a Target, sends the delivery's
// event again in the background.
func (s *Server) redeliver(w http.ResponseWriter, id int64) {
	s.mu.Lock()
	i := slices.IndexFunc(s.deliveries, func(d Delivery) bool { return d.ID == id })
	if i < 0 {
		s.mu.Unlock()
		writeError(w, http.StatusNotFound, "Not Found")
		return
	}
	d := s.deliveries[i]
	if time.Since(d.DeliveredAt) > s.cfg.Window {
		s.mu.Unlock()
		writeError(w, http.StatusUnprocessableEntity, "Validation Failed: delivery is too old to redeliver")
		return
	}
	s.attempts = append(s.attempts, d.GUID)
	_, known := s.bodies[d.GUID]
	s.mu.Unlock()
	if s.cfg.Target != "" && known {
		s.wg.Go(func() { s.send(context.Background(), d.GUID, true) })
	}
	writeJSON(w, http.StatusAccepted, struct{}{})
}

// authorized checks "Bearer TOKEN" (or "token TOKEN") against the token, or
// the App's JSON Web Token against its key.
func (s *Server) authorized(h string) bool {
	scheme, cred, ok := strings.Cut(h, " ")
	if !ok || (scheme != "Bearer" && scheme != "token") || cred == "" {
		return false
	}
	if s.cfg.AppKey == nil {
		return hmac.Equal([]byte(cred), []byte(s.cfg.Token))
	}
	parts := strings.Split(cred, ".")
	if len(parts) != 3 {
		return false
	}
	hb, err1 := base64.RawURLEncoding.DecodeString(parts[0])
	cb, err2 := base64.RawURLEncoding.DecodeString(parts[1])
	sig, err3 := base64.RawURLEncoding.DecodeString(parts[2])
	if err1 != nil || err2 != nil || err3 != nil {
		return false
	}
	var hdr struct {
		Alg string `json:"alg"`
	}
	var c struct {
		Iat int64  `json:"iat"`
		Exp int64  `json:"exp"`
		Iss string `json:"iss"`
	}
	if json.Unmarshal(hb, &hdr) != nil || hdr.Alg != "RS256" || json.Unmarshal(cb, &c) != nil {
		return false
	}
	sum := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if rsa.VerifyPKCS1v15(s.cfg.AppKey, crypto.SHA256, sum[:], sig) != nil {
		return false
	}
	now := time.Now().Unix()
	return c.Iss == s.cfg.AppID && c.Iat <= now && now < c.Exp && c.Exp-c.Iat <= 11*60
}

// Authorizations returns the Authorization headers of the requests served.
func (s *Server) Authorizations() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.auths)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{
		"message":           msg,
		"documentation_url": "https://docs.github.com/rest",
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
