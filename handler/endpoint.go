package handler

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/db"
)

// DefaultMaxBodyBytes is the default body limit: 32 MiB, above GitHub's
// 25 MB payload cap.
const DefaultMaxBodyBytes = 32 << 20

// DefaultReplayWindow is how far back the replay guard looks by default: the
// default retention of the events table.
const DefaultReplayWindow = 14 * 24 * time.Hour

// ReplayGuard selects whether an endpoint checks for replayed bodies.
type ReplayGuard int

// Replay guard settings.
const (
	// ReplayGuardAuto turns the guard on for providers whose key is not
	// signed (those implementing KeyUnsigned and reporting true: GitHub,
	// Shopify, HMAC with KeyHeader), off otherwise.
	ReplayGuardAuto ReplayGuard = iota
	// ReplayGuardOn always checks.
	ReplayGuardOn
	// ReplayGuardOff never checks.
	ReplayGuardOff
)

// Config configures an Endpoint.
type Config struct {
	// Source names the endpoint; event keys are unique per source
	// ("stripe", "github-prod"). Required.
	Source string
	// Provider verifies and identifies deliveries. Required.
	Provider Provider
	// Routes maps event types to routes. A type with no route (and no
	// Fallback) is answered 200 without running or writing anything, and
	// logged and reported as OutcomeIgnored.
	Routes map[string]Route
	// Fallback, if set, handles every type that Routes lacks.
	Fallback Route
	// MaxBodyBytes is the largest accepted body; larger ones are answered
	// 413. Defaults to DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// InFlightStatus answers a delivery whose key another delivery holds:
	// http.StatusConflict or http.StatusServiceUnavailable, always with
	// Retry-After. Defaults to http.StatusConflict.
	InFlightStatus int
	// ReplayGuard selects the replay guard. The guard hashes the signed body
	// (SHA-256, stored with the event) and answers a delivery whose body was
	// already recorded under another key of this source within ReplayWindow
	// as a duplicate, logging a suspected replay. Defaults to
	// ReplayGuardAuto.
	ReplayGuard ReplayGuard
	// ReplayWindow is how far back the guard looks. Defaults to
	// DefaultReplayWindow.
	ReplayWindow time.Duration
	// ReplayLockTimeout bounds how long a Tx route's guard check waits for
	// a concurrent delivery of the same body under another key to finish;
	// past it the delivery is answered in flight. Defaults to 2s.
	ReplayLockTimeout time.Duration
	// DB is the database the processor uses (usually the same
	// *pgxpool.Pool). The replay guard checks Tx routes inside their own
	// transaction, and needs DB only to check other routes before they run:
	// it is required when the guard is on and a route or the fallback is
	// not a Tx route.
	DB txhook.Querier
	// Logger receives one record per delivery. Defaults to slog.Default().
	Logger *slog.Logger
	// Observer, if set, receives a Report per delivery (for metrics).
	Observer Observer
	// Now is the clock used to check signed timestamps. Defaults to
	// time.Now.
	Now func() time.Time
}

// Endpoint is an http.Handler receiving one source's webhooks. It verifies
// each delivery, routes it by event type, applies it through the processor,
// and answers with the status that makes the sender do the right thing:
// never 2xx unless the event's effects are committed (or it duplicates a
// committed event). It is safe for concurrent use.
type Endpoint struct {
	proc      *txhook.Processor
	source    string
	provider  Provider
	routes    map[string]Route
	fallback  Route
	maxBody   int64
	inFlight  int
	guard     bool
	window    float64
	guardWait string // lock_timeout of the replay guard's check
	queries   *db.Queries
	log       *slog.Logger
	observer  Observer
	now       func() time.Time
}

// New returns an Endpoint applying events through p.
func New(p *txhook.Processor, cfg *Config) (*Endpoint, error) {
	if p == nil {
		return nil, errors.New("handler: new endpoint: nil processor")
	}
	if cfg == nil {
		return nil, errors.New("handler: new endpoint: nil config")
	}
	c := *cfg
	if c.Source == "" {
		return nil, errors.New("handler: new endpoint: empty source")
	}
	if err := (txhook.Event{Source: c.Source, Key: "k"}).Validate(); err != nil {
		return nil, fmt.Errorf("handler: new endpoint: %w", err)
	}
	if c.Provider == nil {
		return nil, errors.New("handler: new endpoint: nil provider")
	}
	if v, ok := c.Provider.(Validator); ok {
		if err := v.Validate(); err != nil {
			return nil, fmt.Errorf("handler: new endpoint: provider: %w", err)
		}
	}
	if c.MaxBodyBytes < 0 || c.ReplayWindow < 0 || c.ReplayLockTimeout < 0 {
		return nil, errors.New("handler: new endpoint: negative limit in config")
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	switch c.InFlightStatus {
	case 0:
		c.InFlightStatus = http.StatusConflict
	case http.StatusConflict, http.StatusServiceUnavailable:
	default:
		return nil, fmt.Errorf("handler: new endpoint: InFlightStatus %d is not 409 or 503", c.InFlightStatus)
	}
	if c.ReplayWindow == 0 {
		c.ReplayWindow = DefaultReplayWindow
	}
	if c.ReplayLockTimeout == 0 {
		c.ReplayLockTimeout = 2 * time.Second
	}
	guard := false
	switch c.ReplayGuard {
	case ReplayGuardAuto:
		if ku, ok := c.Provider.(KeyUnsigned); ok {
			guard = ku.KeyUnsigned()
		}
	case ReplayGuardOn:
		guard = true
	case ReplayGuardOff:
	default:
		return nil, fmt.Errorf("handler: new endpoint: unknown ReplayGuard %d", c.ReplayGuard)
	}
	routes := make(map[string]Route, len(c.Routes))
	allTx := true
	for t, r := range c.Routes {
		if r == nil {
			return nil, fmt.Errorf("handler: new endpoint: nil route for type %q", t)
		}
		tr, ok := r.(*TxRoute)
		if ok && tr.Handler == nil {
			return nil, fmt.Errorf("handler: new endpoint: nil handler for type %q", t)
		}
		allTx = allTx && ok
		routes[t] = r
	}
	if c.Fallback != nil {
		tr, ok := c.Fallback.(*TxRoute)
		if ok && tr.Handler == nil {
			return nil, errors.New("handler: new endpoint: nil fallback handler")
		}
		allTx = allTx && ok
	}
	if guard && !allTx && c.DB == nil {
		return nil, errors.New("handler: new endpoint: the replay guard needs Config.DB for routes that are not Tx routes (or set ReplayGuard: ReplayGuardOff)")
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	e := &Endpoint{
		proc:      p,
		source:    c.Source,
		provider:  c.Provider,
		routes:    routes,
		fallback:  c.Fallback,
		maxBody:   c.MaxBodyBytes,
		inFlight:  c.InFlightStatus,
		guard:     guard,
		window:    c.ReplayWindow.Seconds(),
		guardWait: fmt.Sprintf("%dms", max(c.ReplayLockTimeout.Milliseconds(), 1)),
		log:       c.Logger,
		observer:  c.Observer,
		now:       c.Now,
	}
	if guard && c.DB != nil {
		e.queries = db.New(c.DB)
	}
	return e, nil
}

// Source returns the endpoint's source name.
func (e *Endpoint) Source() string { return e.source }

// Route returns the route for eventType: its registered route, else the
// fallback; ok is false when there is neither.
func (e *Endpoint) Route(eventType string) (r Route, ok bool) {
	if r, ok := e.routes[eventType]; ok {
		return r, true
	}
	return e.fallback, e.fallback != nil
}

// TxHandler returns the transactional handler that would apply an event of
// eventType (its route's, else the fallback's), for replaying recorded
// events. ok is false when that route is not a transactional one.
func (e *Endpoint) TxHandler(eventType string) (txhook.HandlerFunc, bool) {
	r, ok := e.Route(eventType)
	if !ok {
		return nil, false
	}
	tr, ok := r.(interface{ TxHandler() txhook.HandlerFunc })
	if !ok || tr.TxHandler() == nil {
		return nil, false
	}
	return tr.TxHandler(), true
}

// answer is the outcome of one delivery, before it is written.
type answer struct {
	outcome    Outcome
	status     int
	retryAfter time.Duration
	err        error
}

// ServeHTTP receives one delivery.
func (e *Endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	var d Delivery
	a := e.serve(w, r, &d)
	if a.status == http.StatusMethodNotAllowed {
		w.Header().Set("Allow", http.MethodPost)
	}
	if a.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(retrySeconds(a.retryAfter), 10))
	}
	writeJSON(w, a.status, a.outcome)
	e.report(r.Context(), Report{
		Source:   e.source,
		Key:      clip(d.Key),
		Type:     clip(d.Type),
		Outcome:  a.outcome,
		Status:   a.status,
		Duration: time.Since(start),
		Err:      a.err,
	})
}

func (e *Endpoint) serve(w http.ResponseWriter, r *http.Request, d *Delivery) answer {
	if r.Method != http.MethodPost {
		return answer{outcome: OutcomeMethodNotAllowed, status: http.StatusMethodNotAllowed}
	}
	if r.ContentLength > e.maxBody {
		return answer{outcome: OutcomeTooLarge, status: http.StatusRequestEntityTooLarge}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, e.maxBody))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return answer{outcome: OutcomeTooLarge, status: http.StatusRequestEntityTooLarge, err: err}
		}
		return answer{outcome: OutcomeBadRequest, status: http.StatusBadRequest, err: fmt.Errorf("read body: %w", err)}
	}
	if err := e.provider.Verify(r.Header, body, e.now()); err != nil {
		if errors.Is(err, ErrTimestamp) {
			return answer{outcome: OutcomeStaleTimestamp, status: http.StatusBadRequest, err: err}
		}
		return answer{outcome: OutcomeBadSignature, status: http.StatusBadRequest, err: err}
	}
	*d, err = e.provider.Extract(r.Header, body)
	if err != nil {
		return answer{outcome: OutcomeBadRequest, status: http.StatusBadRequest, err: err}
	}
	if d.Ping {
		return answer{outcome: OutcomePing, status: http.StatusOK}
	}
	route, ok := e.Route(d.Type)
	if !ok {
		return answer{outcome: OutcomeIgnored, status: http.StatusOK}
	}
	ev := txhook.Event{Source: e.source, Key: d.Key, Type: d.Type, Payload: body}
	ctx := r.Context()
	if e.guard {
		sum := sha256.Sum256(body)
		ev.PayloadHash = sum[:]
		if tr, ok := route.(*TxRoute); ok {
			route = Tx(e.guardTx(tr.Handler))
		} else if a, done := e.checkReplay(ctx, ev); done {
			return a
		}
	}
	res, err := route.Apply(ctx, e.proc, ev)
	if re, ok := errors.AsType[*replayError](err); ok {
		e.logReplay(ctx, ev, re.original)
		return answer{outcome: OutcomeReplay, status: http.StatusOK}
	}
	if errors.Is(err, errGuardBusy) {
		// Another delivery of the same body holds the guard's lock.
		return e.mapResult(txhook.Result{Outcome: txhook.OutcomeInFlight, RetryAfter: guardRetryAfter}, nil)
	}
	return e.mapResult(res, err)
}

// replayError is returned by a guarded handler that found the delivery's
// body recorded under another key; its transaction rolls back.
type replayError struct{ original string }

func (e *replayError) Error() string { return "replayed body of event " + e.original }

// errGuardBusy is returned by a guarded handler that gave up waiting for a
// concurrent delivery of the same body; its transaction rolls back.
var errGuardBusy = errors.New("replay guard: a delivery of the same body is in flight")

// guardRetryAfter is the Retry-After answered with errGuardBusy.
const guardRetryAfter = 2 * time.Second

// guardTx wraps a transactional handler with the replay guard's check, run
// in the transaction that has just inserted the delivery's key and hash.
// The check serialises deliveries of the same body on an advisory lock, so
// of two concurrent deliveries under different keys only the first to
// commit runs its handler (under READ COMMITTED, the default).
func (e *Endpoint) guardTx(h txhook.HandlerFunc) txhook.HandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		other, err := db.New(tx).LockAndFindPayloadHash(ctx, db.LockAndFindPayloadHashParams{
			Source:        ev.Source,
			PayloadHash:   ev.PayloadHash,
			EventKey:      ev.Key,
			WindowSeconds: e.window,
			LockTimeout:   e.guardWait,
		})
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "55P03" {
			return errGuardBusy
		}
		if err != nil {
			return fmt.Errorf("check replay: %w", err)
		}
		if other != "" {
			return &replayError{original: other}
		}
		return h(ctx, tx, ev)
	}
}

func (e *Endpoint) logReplay(ctx context.Context, ev txhook.Event, original string) {
	e.log.LogAttrs(ctx, slog.LevelWarn, "txhook: suspected replay: body already processed under another key",
		slog.String("source", ev.Source), slog.String("key", ev.Key), slog.String("type", ev.Type),
		slog.String("original_key", original))
}

// checkReplay answers a delivery whose body hash is already recorded under
// another key, for routes that are not Tx routes: one indexed lookup before
// processing, which sees committed events only.
func (e *Endpoint) checkReplay(ctx context.Context, ev txhook.Event) (answer, bool) {
	if !utf8.ValidString(ev.Key) || strings.IndexByte(ev.Key, 0) >= 0 {
		// Not storable as text: Process rejects it with ErrInvalidEvent.
		return answer{}, false
	}
	other, err := e.queries.FindPayloadHash(ctx, db.FindPayloadHashParams{
		Source:        ev.Source,
		PayloadHash:   ev.PayloadHash,
		EventKey:      ev.Key,
		WindowSeconds: e.window,
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return answer{}, false
	case err != nil:
		return answer{outcome: OutcomeUnavailable, status: http.StatusServiceUnavailable, err: fmt.Errorf("check replay: %w", err)}, true
	}
	e.logReplay(ctx, ev, other)
	return answer{outcome: OutcomeReplay, status: http.StatusOK}, true
}

func (e *Endpoint) mapResult(res txhook.Result, err error) answer {
	if err != nil {
		switch {
		case errors.Is(err, txhook.ErrInvalidEvent):
			return answer{outcome: OutcomeBadRequest, status: http.StatusBadRequest, err: err}
		case unavailable(err):
			return answer{outcome: OutcomeUnavailable, status: http.StatusServiceUnavailable, retryAfter: unavailableRetryAfter, err: err}
		}
		return answer{outcome: OutcomeError, status: http.StatusInternalServerError, err: err}
	}
	switch res.Outcome {
	case txhook.OutcomeProcessed:
		return answer{outcome: OutcomeProcessed, status: http.StatusOK}
	case txhook.OutcomeDuplicate:
		return answer{outcome: OutcomeDuplicate, status: http.StatusOK}
	case txhook.OutcomeFailed:
		// Recorded for an operator to replay; the sender must stop retrying.
		return answer{outcome: OutcomeFailed, status: http.StatusOK, err: res.Err}
	case txhook.OutcomeInFlight:
		return answer{outcome: OutcomeInFlight, status: e.inFlight, retryAfter: max(res.RetryAfter, time.Second)}
	}
	return answer{outcome: OutcomeError, status: http.StatusInternalServerError,
		err: fmt.Errorf("apply event: unexpected outcome %v", res.Outcome)}
}

// unavailableRetryAfter is the Retry-After of a 503 answered because the
// database could not be used.
const unavailableRetryAfter = 5 * time.Second

// unavailable reports whether err means the database could not be used or
// the commit's outcome is unknown: the sender should retry later.
func unavailable(err error) bool {
	if errors.Is(err, txhook.ErrUnavailable) || errors.Is(err, txhook.ErrCommitUnknown) {
		return true
	}
	if _, ok := errors.AsType[*pgconn.ConnectError](err); ok {
		return true
	}
	if _, ok := errors.AsType[net.Error](err); ok {
		return true
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// maxReported bounds the key and type put in logs and reports: a rejected
// delivery may carry an unsigned id header of any length.
const maxReported = 256

// clip shortens s to at most maxReported bytes, on a rune boundary.
func clip(s string) string {
	if len(s) <= maxReported {
		return s
	}
	cut := maxReported
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// retrySeconds rounds d up to whole seconds, at least 1.
func retrySeconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, 1)
}

// messages are the fixed texts sent with each outcome; they carry no
// details of the delivery, the handler or the database.
var messages = map[Outcome]string{
	OutcomeMethodNotAllowed: "use POST",
	OutcomeTooLarge:         "body too large",
	OutcomeBadSignature:     "signature missing or invalid",
	OutcomeStaleTimestamp:   "timestamp missing or outside tolerance",
	OutcomeBadRequest:       "malformed delivery or invalid event key",
	OutcomeInFlight:         "event is being processed; retry later",
	OutcomeError:            "event not processed; retry later",
	OutcomeUnavailable:      "service unavailable; retry later",
}

// writeJSON writes the answer's JSON body (see answerBody) with its status.
func writeJSON(w http.ResponseWriter, status int, o Outcome) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(answerBody(status, o))
}

// answerBody returns {"status":"<outcome>"} for 2xx answers and
// {"error":"<outcome>","message":"…"} otherwise, followed by a newline. The
// bodies of the package's outcomes are encoded once, in answerBodies.
func answerBody(status int, o Outcome) []byte {
	k := bodyKey{ok: status < 300, outcome: o}
	if b, found := answerBodies[k]; found {
		return b
	}
	return encodeAnswer(k)
}

// bodyKey selects an answer body: its outcome, and whether the status is
// 2xx.
type bodyKey struct {
	ok      bool
	outcome Outcome
}

// answerBodies holds the encoded body of every outcome, for both classes of
// status. It is never modified after initialisation.
var answerBodies = func() map[bodyKey][]byte {
	all := []Outcome{
		OutcomeProcessed, OutcomeDuplicate, OutcomeReplay, OutcomeFailed, OutcomeIgnored,
		OutcomePing, OutcomeInFlight, OutcomeMethodNotAllowed, OutcomeTooLarge,
		OutcomeBadSignature, OutcomeStaleTimestamp, OutcomeBadRequest, OutcomeError,
		OutcomeUnavailable,
	}
	m := make(map[bodyKey][]byte, 2*len(all))
	for _, o := range all {
		for _, ok := range []bool{true, false} {
			k := bodyKey{ok: ok, outcome: o}
			m[k] = encodeAnswer(k)
		}
	}
	return m
}()

func encodeAnswer(k bodyKey) []byte {
	var v any
	if k.ok {
		v = struct {
			Status Outcome `json:"status"`
		}{k.outcome}
	} else {
		v = struct {
			Error   Outcome `json:"error"`
			Message string  `json:"message"`
		}{k.outcome, messages[k.outcome]}
	}
	b, _ := json.Marshal(v) // strings only: cannot fail
	return append(b, '\n')
}

func (e *Endpoint) report(ctx context.Context, r Report) {
	level := slog.LevelInfo
	switch {
	case r.Status >= 500:
		level = slog.LevelError
	case r.Status >= 400 || r.Outcome == OutcomeFailed:
		level = slog.LevelWarn
	}
	attrs := []slog.Attr{
		slog.String("source", r.Source),
		slog.String("key", r.Key),
		slog.String("type", r.Type),
		slog.String("outcome", string(r.Outcome)),
		slog.Int("status", r.Status),
		slog.Duration("duration", r.Duration),
	}
	if r.Err != nil {
		attrs = append(attrs, slog.String("error", r.Err.Error()))
	}
	e.log.LogAttrs(ctx, level, "txhook: delivery", attrs...)
	if e.observer != nil {
		e.observer.ObserveDelivery(ctx, r)
	}
}
