package handler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/internal/clip"
)

// DefaultMaxBodyBytes is the body limit of providers whose senders document
// no larger payloads (see Config.MaxBodyBytes): 1 MiB.
const DefaultMaxBodyBytes = 1 << 20

// DefaultBodyReadTimeout bounds reading a delivery's body unless
// Config.BodyReadTimeout says otherwise: 15s, the longest response timeout
// of the common senders (Standard Webhooks / Svix; GitHub allows 10s,
// Shopify 5s), after which the sender has given up on the delivery anyway.
const DefaultBodyReadTimeout = 15 * time.Second

// DefaultReplayWindow is how far back the replay guard looks by default: the
// default retention of the events table (txhook.DefaultRetention).
const DefaultReplayWindow = txhook.DefaultRetention

// ReplayGuard selects whether an endpoint checks for replayed bodies.
type ReplayGuard int

// Replay guard settings.
const (
	// ReplayGuardAuto turns the guard on for providers whose key or type
	// is not signed (those implementing KeyUnsigned and reporting true:
	// GitHub, Shopify, HMAC with KeyHeader or TypeHeader), off otherwise.
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
	// logged and reported as AnswerIgnored.
	Routes map[string]Route
	// Fallback, if set, handles every type that Routes lacks.
	Fallback Route
	// MaxBodyBytes is the largest accepted body; larger ones are answered
	// 413. A body is read before its signature can be checked, into a
	// buffer that grows as its bytes arrive (from at most 64 KiB), never
	// past its declared length or this limit: the limit bounds what an
	// unsigned request costs, and a declared length not yet sent costs at
	// most 64 KiB. Defaults to the provider's documented maximum, with
	// room: 25 MiB for GitHub (its payloads are capped at 25 MB), 4 MiB for
	// Shopify (no documented cap; its bodies can exceed a megabyte), and
	// DefaultMaxBodyBytes for the others (Stripe documents no cap; the
	// Standard Webhooks specification recommends payloads under 20 kB).
	MaxBodyBytes int64
	// BodyReadTimeout bounds reading the body: the endpoint sets the
	// connection's read deadline (http.ResponseController) before it
	// reads, and a body not received in time is answered 408 and its
	// connection closed. It complements, and does not replace, the
	// server's ReadHeaderTimeout, ReadTimeout and WriteTimeout. Defaults
	// to DefaultBodyReadTimeout; a negative value sets no deadline.
	BodyReadTimeout time.Duration
	// InFlightStatus answers a delivery whose key another delivery holds:
	// http.StatusConflict or http.StatusServiceUnavailable, always with
	// Retry-After. Defaults to http.StatusConflict.
	InFlightStatus int
	// ReplayGuard selects the replay guard. The guard hashes the signed body
	// (SHA-256; with the type too for providers whose bodies can repeat
	// across types, see SharedBodies), stores the hash with the event, and
	// answers a delivery whose hash was already recorded under another key
	// of this source within ReplayWindow as a replay, logging a suspected
	// replay. With the guard on, deliveries answered ignored or ping are
	// recorded too (key and hash, nothing else runs), so that their bodies
	// cannot be replayed later under a routed type. Defaults to
	// ReplayGuardAuto.
	ReplayGuard ReplayGuard
	// ReplayWindow is how far back the guard looks. Pruning shortens it in
	// effect to the prune retention (see txhook.PrunerConfig.ReplayWindow).
	// Defaults to DefaultReplayWindow.
	ReplayWindow time.Duration
	// ReplayLockTimeout bounds how long the guard waits for a concurrent
	// delivery of the same body under another key to finish; past it the
	// delivery is answered in flight. Defaults to 2s.
	ReplayLockTimeout time.Duration
	// DB is the database the processor uses. The replay guard checks Tx
	// routes inside their own transaction and lease routes inside their
	// claim; a route of any other kind runs while the guard holds its lock
	// in a transaction of its own on DB, so DB is required when the guard
	// is on and a route or the fallback is neither a Tx nor a Lease route.
	//
	// Such a route's delivery holds two connections at once: DB's, for the
	// guard's lock, and the processor's, for the route's own Process or
	// ProcessLease. Give DB a pool of its own (a second *pgxpool.Pool on
	// the same database), or, with the processor's pool, keep its MaxConns
	// at least twice the deliveries of such routes in flight at once:
	// otherwise deliveries can each hold a guard connection and wait for a
	// second one until their contexts end (answered 503), none of them
	// progressing. Tx and Lease routes hold one connection.
	DB txhook.Beginner
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
	proc     *txhook.Processor
	source   string
	provider Provider
	routes   map[string]Route
	fallback Route
	jsonOnly bool // form-encoded deliveries are answered 415 (GitHub)
	maxBody  int64
	readWait time.Duration // Config.BodyReadTimeout; <= 0: none
	inFlight int
	guard    *guard // nil when the replay guard is off
	log      *slog.Logger
	observer Observer
	now      func() time.Time
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
		c.MaxBodyBytes = defaultMaxBody(c.Provider)
	}
	if c.BodyReadTimeout == 0 {
		c.BodyReadTimeout = DefaultBodyReadTimeout
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
	guarded := false
	switch c.ReplayGuard {
	case ReplayGuardAuto:
		if ku, ok := c.Provider.(KeyUnsigned); ok {
			guarded = ku.KeyUnsigned()
		}
	case ReplayGuardOn:
		guarded = true
	case ReplayGuardOff:
	default:
		return nil, fmt.Errorf("handler: new endpoint: unknown ReplayGuard %d", c.ReplayGuard)
	}
	routes := make(map[string]Route, len(c.Routes))
	for t, r := range c.Routes {
		if r == nil {
			return nil, fmt.Errorf("handler: new endpoint: nil route for type %q", t)
		}
		if tr, ok := r.(*TxRoute); ok && tr.Handler == nil {
			return nil, fmt.Errorf("handler: new endpoint: nil handler for type %q", t)
		}
		routes[t] = r
	}
	if tr, ok := c.Fallback.(*TxRoute); ok && tr.Handler == nil {
		return nil, errors.New("handler: new endpoint: nil fallback handler")
	}
	var g *guard
	if guarded {
		var err error
		g, err = newGuard(&c, routes)
		if err != nil {
			return nil, fmt.Errorf("handler: new endpoint: %w", err)
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	e := &Endpoint{
		proc:     p,
		source:   c.Source,
		provider: c.Provider,
		routes:   routes,
		fallback: c.Fallback,
		maxBody:  c.MaxBodyBytes,
		jsonOnly: isGitHub(c.Provider),
		readWait: c.BodyReadTimeout,
		inFlight: c.InFlightStatus,
		guard:    g,
		log:      c.Logger,
		observer: c.Observer,
		now:      c.Now,
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

// reply is the answer to one delivery, before it is written.
type reply struct {
	outcome    Answer
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
		Key:      clip.Reported(d.Key),
		Type:     clip.Reported(d.Type),
		Answer:   a.outcome,
		Status:   a.status,
		Duration: time.Since(start),
		Err:      a.err,
	})
}

func (e *Endpoint) serve(w http.ResponseWriter, r *http.Request, d *Delivery) reply {
	if r.Method != http.MethodPost {
		return reply{outcome: AnswerMethodNotAllowed, status: http.StatusMethodNotAllowed}
	}
	if e.jsonOnly && formEncoded(r.Header) {
		return reply{outcome: AnswerUnsupportedMediaType, status: http.StatusUnsupportedMediaType,
			err: errors.New("form-encoded delivery: the webhook's content type must be application/json")}
	}
	if r.ContentLength > e.maxBody {
		return reply{outcome: AnswerTooLarge, status: http.StatusRequestEntityTooLarge}
	}
	if e.readWait > 0 {
		// Not every ResponseWriter can (a test recorder): then the server's
		// own timeouts are the only bound.
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(e.readWait))
	}
	body, err := readBody(http.MaxBytesReader(w, r.Body, e.maxBody), r.ContentLength, e.maxBody)
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return reply{outcome: AnswerTooLarge, status: http.StatusRequestEntityTooLarge, err: err}
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return reply{outcome: AnswerTimeout, status: http.StatusRequestTimeout, err: fmt.Errorf("read body: %w", err)}
		}
		return reply{outcome: AnswerBadRequest, status: http.StatusBadRequest, err: fmt.Errorf("read body: %w", err)}
	}
	if err := e.provider.Verify(r.Header, body, e.now()); err != nil {
		if errors.Is(err, ErrTimestamp) {
			return reply{outcome: AnswerStaleTimestamp, status: http.StatusBadRequest, err: err}
		}
		return reply{outcome: AnswerBadSignature, status: http.StatusBadRequest, err: err}
	}
	*d, err = e.provider.Extract(r.Header, body)
	if err != nil {
		return reply{outcome: AnswerBadRequest, status: http.StatusBadRequest, err: err}
	}
	quiet := AnswerPing // answered 200 without running a route
	route, ok := e.Route(d.Type)
	switch {
	case d.Ping:
	case !ok:
		quiet = AnswerIgnored
	default:
		quiet = ""
	}
	if quiet != "" && e.guard == nil {
		return reply{outcome: quiet, status: http.StatusOK}
	}
	ev := txhook.Event{Source: e.source, Key: d.Key, Type: d.Type, Payload: body}
	if e.guard != nil {
		ev.PayloadHash = e.guard.hash(d.Type, body)
		route = e.guard.route(d.Type, quiet != "")
	}
	ctx := r.Context()
	res, err := route.Apply(ctx, e.proc, ev)
	if re, ok := errors.AsType[*txhook.ReplayError](err); ok {
		e.logReplay(ctx, ev, re.Key)
		return reply{outcome: AnswerReplay, status: http.StatusOK}
	}
	if errors.Is(err, txhook.ErrReplayInFlight) {
		// Another delivery of the same body holds the guard's lock.
		return e.mapResult(txhook.Result{Outcome: txhook.OutcomeInFlight, RetryAfter: guardRetryAfter}, nil)
	}
	a := e.mapResult(res, err)
	if quiet != "" && a.outcome == AnswerProcessed {
		a.outcome = quiet // recorded for the guard; nothing else ran
	}
	return a
}

// guardRetryAfter is the Retry-After answered with txhook.ErrReplayInFlight.
const guardRetryAfter = 2 * time.Second

func (e *Endpoint) logReplay(ctx context.Context, ev txhook.Event, original string) {
	e.log.LogAttrs(ctx, slog.LevelWarn, "txhook: suspected replay: body already processed under another key",
		slog.String("source", ev.Source), slog.String("key", ev.Key), slog.String("type", ev.Type),
		slog.String("original_key", original))
}

func (e *Endpoint) mapResult(res txhook.Result, err error) reply {
	if err != nil {
		switch {
		case errors.Is(err, txhook.ErrInvalidEvent):
			return reply{outcome: AnswerBadRequest, status: http.StatusBadRequest, err: err}
		case unavailable(err):
			return reply{outcome: AnswerUnavailable, status: http.StatusServiceUnavailable, retryAfter: unavailableRetryAfter, err: err}
		}
		return reply{outcome: AnswerError, status: http.StatusInternalServerError, err: err}
	}
	switch res.Outcome {
	case txhook.OutcomeProcessed:
		return reply{outcome: AnswerProcessed, status: http.StatusOK}
	case txhook.OutcomeQueued:
		// Inbox mode: the event and its job are committed; the job applies it.
		return reply{outcome: AnswerQueued, status: http.StatusAccepted}
	case txhook.OutcomeDuplicate:
		return reply{outcome: AnswerDuplicate, status: http.StatusOK}
	case txhook.OutcomeFailed:
		// Recorded for an operator to replay; the sender must stop retrying.
		return reply{outcome: AnswerFailed, status: http.StatusOK, err: res.Err}
	case txhook.OutcomeInFlight:
		return reply{outcome: AnswerInFlight, status: e.inFlight, retryAfter: max(res.RetryAfter, time.Second)}
	}
	return reply{outcome: AnswerError, status: http.StatusInternalServerError,
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

// retrySeconds rounds d up to whole seconds, at least 1.
func retrySeconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, 1)
}

// messages are the fixed texts sent with each outcome; they carry no
// details of the delivery, the handler or the database.
var messages = map[Answer]string{
	AnswerMethodNotAllowed:     "use POST",
	AnswerTooLarge:             "body too large",
	AnswerTimeout:              "body not received in time",
	AnswerUnsupportedMediaType: "form-encoded deliveries are not accepted: set the webhook's content type to application/json",
	AnswerBadSignature:         "signature missing or invalid",
	AnswerStaleTimestamp:       "timestamp missing or outside tolerance",
	AnswerBadRequest:           "malformed delivery or invalid event key",
	AnswerInFlight:             "event is being processed; retry later",
	AnswerError:                "event not processed; retry later",
	AnswerUnavailable:          "service unavailable; retry later",
}

// writeJSON writes the answer's JSON body (see answerBody) with its status.
func writeJSON(w http.ResponseWriter, status int, o Answer) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(answerBody(status, o))
}

// answerBody returns {"status":"<outcome>"} for 2xx answers and
// {"error":"<outcome>","message":"…"} otherwise, followed by a newline. The
// bodies of the package's outcomes are encoded once, in answerBodies.
func answerBody(status int, o Answer) []byte {
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
	outcome Answer
}

// answerBodies holds the encoded body of every outcome, for both classes of
// status. It is never modified after initialisation.
var answerBodies = func() map[bodyKey][]byte {
	all := []Answer{
		AnswerProcessed, AnswerQueued, AnswerDuplicate, AnswerReplay, AnswerFailed, AnswerIgnored,
		AnswerPing, AnswerInFlight, AnswerMethodNotAllowed, AnswerTooLarge, AnswerTimeout, AnswerUnsupportedMediaType,
		AnswerBadSignature, AnswerStaleTimestamp, AnswerBadRequest, AnswerError,
		AnswerUnavailable,
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
			Status Answer `json:"status"`
		}{k.outcome}
	} else {
		v = struct {
			Error   Answer `json:"error"`
			Message string `json:"message"`
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
	case r.Status >= 400 || r.Answer == AnswerFailed:
		level = slog.LevelWarn
	}
	attrs := []slog.Attr{
		slog.String("source", r.Source),
		slog.String("key", r.Key),
		slog.String("type", r.Type),
		slog.String("outcome", string(r.Answer)),
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
