package handler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/internal/clip"
	"github.com/txhook/txhook/internal/engine"
)

// DefaultMaxBodyBytes is the body limit of providers whose senders document
// no larger payloads (see Config.MaxBodyBytes): 1 MiB.
const DefaultMaxBodyBytes = 1 << 20

// DefaultBodyReadTimeout bounds reading a delivery's body unless
// Config.BodyReadTimeout says otherwise: 15s, the longest response timeout
// of the common senders (Standard Webhooks / Svix; GitHub allows 10s,
// Shopify 5s), after which the sender has given up on the delivery anyway.
const DefaultBodyReadTimeout = 15 * time.Second

// BodyDedupeMode selects whether an endpoint dedupes deliveries by body as
// well as by key (Config.BodyDedupe).
type BodyDedupeMode int

// Body dedupe settings.
const (
	// BodyDedupeAuto turns body dedupe on for providers whose key or type
	// is not signed (those implementing KeyUnsigned and reporting true:
	// GitHub, Shopify, HMAC with KeyHeader or TypeHeader), off otherwise.
	BodyDedupeAuto BodyDedupeMode = iota
	// BodyDedupeOn always checks.
	BodyDedupeOn
	// BodyDedupeOff never checks.
	BodyDedupeOff
)

// Config configures an Endpoint.
type Config struct {
	// Source names the endpoint; event keys are unique per source
	// ("stripe", "github-prod"). Required.
	Source string
	// Provider verifies and identifies deliveries. Required.
	Provider Provider
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
	// BodyDedupe selects body dedupe, against captured bodies sent again
	// under a fresh key (replay attacks on providers whose keys are not
	// signed). It hashes the signed body (SHA-256; with the type too for
	// providers whose bodies can repeat across types, see SharedBodies),
	// stores the hash with the event, and answers a delivery whose hash was
	// already recorded under another key of this source within
	// BodyDedupeWindow as AnswerDuplicateBody, logging a suspected replay
	// attack. With it on, deliveries answered ignored or ping are recorded
	// too (key and hash, nothing else runs), so that their bodies cannot
	// come back later under a routed type. Defaults to BodyDedupeAuto.
	BodyDedupe BodyDedupeMode
	// BodyDedupeWindow is how far back body dedupe looks. Pruning shortens
	// it in effect to the prune retention (see
	// txhook.PrunerConfig.BodyDedupeWindow). Defaults to
	// txhook.DefaultRetention, the events table's default retention.
	BodyDedupeWindow time.Duration
	// BodyDedupeLockTimeout bounds how long body dedupe waits for a concurrent
	// delivery of the same body under another key to finish; past it the
	// delivery is answered in flight. Defaults to 2s.
	BodyDedupeLockTimeout time.Duration
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
	jsonOnly bool // form-encoded deliveries are answered 415 (GitHub)
	maxBody  int64
	readWait time.Duration // Config.BodyReadTimeout; <= 0: none
	inFlight int
	guard    *guard // nil when the body dedupe is off
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
	if c.MaxBodyBytes < 0 || c.BodyDedupeWindow < 0 || c.BodyDedupeLockTimeout < 0 {
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
	guarded := false
	switch c.BodyDedupe {
	case BodyDedupeAuto:
		if ku, ok := c.Provider.(KeyUnsigned); ok {
			guarded = ku.KeyUnsigned()
		}
	case BodyDedupeOn:
		guarded = true
	case BodyDedupeOff:
	default:
		return nil, fmt.Errorf("handler: new endpoint: unknown BodyDedupeMode %d", c.BodyDedupe)
	}
	if !p.HasRoutes(c.Source) {
		return nil, fmt.Errorf("handler: new endpoint: no route for source %q: register its handlers in the processor's txhook.Config.Routes", c.Source)
	}
	var g *guard
	if guarded {
		g = newGuard(&c)
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
	ev := txhook.Event{Source: e.source, Key: d.Key, Type: d.Type, Payload: body}
	opts := txhook.DeliverOptions{Ignore: d.Ping}
	if e.guard != nil {
		ev.PayloadHash = e.guard.hash(d.Type, body)
		opts.BodyDedupe = &e.guard.rg
	}
	ctx := r.Context()
	res, err := e.proc.Deliver(ctx, ev, &opts)
	if re, ok := errors.AsType[*txhook.DuplicateBodyError](err); ok {
		e.logReplay(ctx, ev, re.Key)
		return reply{outcome: AnswerDuplicateBody, status: http.StatusOK}
	}
	a := e.mapResult(res, err)
	if d.Ping && a.outcome == AnswerIgnored {
		a.outcome = AnswerPing
	}
	return a
}

func (e *Endpoint) logReplay(ctx context.Context, ev txhook.Event, original string) {
	e.log.LogAttrs(ctx, slog.LevelWarn, "txhook: suspected replay attack: body already received under another key",
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
	case txhook.OutcomeIgnored:
		// No route for the type (recorded when the body dedupe is on).
		return reply{outcome: AnswerIgnored, status: http.StatusOK}
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

// unavailable reports whether err means the database could not be used,
// as the engine classifies it everywhere (engine.Unreachable: what the
// library's own statements met is an *UnavailableError already, and this
// also covers what a route's own code met), or the commit's outcome is
// unknown, or the delivery's context ended: the sender should retry later.
func unavailable(err error) bool {
	return errors.Is(err, txhook.ErrUnavailable) || errors.Is(err, txhook.ErrCommitUnknown) || engine.Unreachable(err) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
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
		AnswerProcessed, AnswerQueued, AnswerDuplicate, AnswerDuplicateBody, AnswerFailed, AnswerIgnored,
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
