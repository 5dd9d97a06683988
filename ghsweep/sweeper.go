package ghsweep

import (
	"cmp"
	"context"
	"crypto/rsa"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/db"
)

// Sweeper lists a webhook's recent deliveries and asks GitHub to redeliver
// those that failed and whose guid is not settled in the events table.
// A Sweeper is safe for concurrent use; runs on one hook, in this process
// or any other, take turns through a PostgreSQL advisory lock.
type Sweeper struct {
	pool    *pgxpool.Pool
	cfg     Config
	hook    string
	listing *url.URL // the deliveries listing's first page
	log     *slog.Logger
	appKey  *rsa.PrivateKey
}

// New returns a Sweeper for cfg that reads and records its state through
// pool, on a database migrated to txhook's schema (migration 0011 or later).
func New(pool *pgxpool.Pool, cfg *Config) (*Sweeper, error) {
	if pool == nil {
		return nil, errors.New("ghsweep: new sweeper: nil pool")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if err := c.Hook.validate(); err != nil {
		return nil, fmt.Errorf("ghsweep: new sweeper: %w", err)
	}
	s := &Sweeper{pool: pool, hook: c.Hook.String()}
	if c.Hook.app {
		if c.AppID == "" || len(c.AppPrivateKey) == 0 {
			return nil, errors.New("ghsweep: new sweeper: an App hook needs AppID and AppPrivateKey")
		}
		k, err := parseAppKey(c.AppPrivateKey)
		if err != nil {
			return nil, fmt.Errorf("ghsweep: new sweeper: %w", err)
		}
		s.appKey = k
	} else if c.Token == "" {
		return nil, fmt.Errorf("ghsweep: new sweeper: hook %s needs a Token", s.hook)
	}
	if c.Source == "" {
		c.Source = "github"
	}
	if err := (txhook.Event{Source: c.Source, Key: "-"}).Validate(); err != nil {
		return nil, fmt.Errorf("ghsweep: new sweeper: Source %q: %w", c.Source, err)
	}
	if c.APIURL == "" {
		c.APIURL = defaultAPIURL
	}
	base, err := url.Parse(c.APIURL)
	if err != nil || (base.Scheme != "https" && base.Scheme != "http") || base.Host == "" {
		return nil, fmt.Errorf("ghsweep: new sweeper: APIURL %q is not an http(s) URL", c.APIURL)
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Timeout: 30 * time.Second}
	}
	c.HTTPClient = originOnly(c.HTTPClient, base)
	if c.Window <= 0 {
		c.Window = defaultWindow
	}
	if c.ResendAfter <= 0 {
		c.ResendAfter = defaultResendAfter
	}
	if c.Backoff <= 0 {
		c.Backoff = defaultBackoff
	}
	if c.PerPage <= 0 || c.PerPage > 100 {
		c.PerPage = defaultPerPage
	}
	if c.MaxPages <= 0 {
		c.MaxPages = defaultMaxPages(c.Window, c.PerPage)
	}
	if c.RunTimeout <= 0 {
		c.RunTimeout = defaultRunTimeout
	}
	if c.MaxRateLimitWait <= 0 {
		c.MaxRateLimitWait = defaultMaxWait
	}
	switch {
	case c.PostPause == 0:
		c.PostPause = defaultPostPause
	case c.PostPause < 0:
		c.PostPause = 0
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	s.listing = c.Hook.deliveries(base)
	q := s.listing.Query()
	q.Set("per_page", strconv.Itoa(c.PerPage))
	s.listing.RawQuery = q.Encode()
	s.cfg = c
	s.log = c.Logger.With("source", c.Source, "hook", s.hook)
	return s, nil
}

// Result is what one run found and did.
type Result struct {
	// Busy reports that another run on the same hook held the lock: this
	// run did nothing.
	Busy bool `json:"busy,omitempty"`
	// Deliveries counts the deliveries listed within the window; New those
	// among them newer than the previous run's newest.
	Deliveries int `json:"deliveries"`
	New        int `json:"new"`
	// Failed counts the guids none of whose listed attempts was answered 2xx.
	Failed int `json:"failed"`
	// Settled counts those of them settled in the events table: never
	// redelivered.
	Settled int `json:"settled"`
	// InFlight counts those held by a lease-mode claim whose lease runs:
	// being processed, so not redelivered now.
	InFlight int `json:"in_flight"`
	// Waiting counts those whose redelivery was requested earlier and is
	// not yet attempted by GitHub (within ResendAfter), or whose earlier
	// redeliveries failed too and which wait out their Backoff.
	Waiting int `json:"waiting"`
	// Redelivered lists the guids this run asked GitHub to redeliver.
	Redelivered []string `json:"redelivered"`
	// Refused counts the redelivery requests GitHub refused (see the error).
	Refused int `json:"refused"`
	// Skipped counts the listed deliveries whose guid or event name cannot
	// be an event's key or type (empty, too long, invalid UTF-8, a NUL
	// byte; see txhook.Event.Validate): never redelivered, each logged.
	Skipped int `json:"skipped"`
	// CutShort says why the run stopped before it had read the window's
	// whole listing or made every redelivery it found (Config.MaxPages, a
	// next page link repeating a page, Config.RunTimeout); empty when it
	// went to the end. A run cut short returns an error saying so.
	CutShort string `json:"cut_short,omitempty"`
}

// unknownAfter is how long a redelivery request whose outcome is unknown
// (its sweeper died while sending it) holds its guid back.
const unknownAfter = time.Minute

// guidState gathers the listed deliveries of one guid.
type guidState struct {
	guid        string
	event       string
	newest      int64 // newest delivery id (the one to redeliver)
	firstFailed time.Time
	ok          bool // an attempt was answered 2xx
}

// Run sweeps the hook once: it lists the deliveries of the last Window,
// keeps the guids none of whose attempts GitHub saw answered 2xx, drops those
// settled in the events table (Source, key = guid), those in flight (held by
// a lease-mode claim whose lease runs) and those whose redelivery is
// already on its way, and asks GitHub to redeliver each of the rest, once.
// ctx bounds the whole run, waits on rate limits included, and so does
// Config.RunTimeout.
//
// Runs on one hook take turns: while another run (in any process) holds the
// hook's advisory lock, Run returns at once with Result.Busy set. Each
// redelivery is recorded before it is requested, so that even runs that do
// not share the lock never request one guid twice within ResendAfter.
//
// Run is the body of a periodic job: call it from cron (txhook github
// redeliver), from RunEvery, or from a job queue's periodic job. A
// redelivery that GitHub refuses does not stop the others, nor does a listed
// delivery whose guid cannot be a key (Result.Skipped); the run returns the
// refusals joined in its error, with the Result of what it did. A refused
// credential, a rate limit wait past MaxRateLimitWait or a database error
// stops the run. A run cut short (Result.CutShort: MaxPages, a repeated
// page, RunTimeout) redelivers what it listed and returns an error saying
// it was cut short. Every run that took the lock is recorded, with its
// error.
func (s *Sweeper) Run(ctx context.Context) (Result, error) {
	started := time.Now()
	runCtx, cancelRun := context.WithTimeoutCause(ctx, s.cfg.RunTimeout, fmt.Errorf("the run reached RunTimeout (%s)", s.cfg.RunTimeout))
	defer cancelRun()
	conn, err := s.pool.Acquire(runCtx)
	if err != nil {
		return Result{}, fmt.Errorf("ghsweep: acquire connection: %w", err)
	}
	q := db.New(conn)
	locked, err := q.TrySweeperLock(runCtx, s.cfg.Source+" "+s.hook)
	if err != nil {
		conn.Release()
		return Result{}, fmt.Errorf("ghsweep: take sweeper lock: %w", err)
	}
	if !locked {
		conn.Release()
		s.log.Info("redelivery sweep skipped: another sweeper holds the lock")
		return Result{Busy: true}, nil
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if ok, err := q.SweeperUnlock(uctx, s.cfg.Source+" "+s.hook); err != nil || !ok {
			// A session that may still hold the lock must not go back to
			// the pool: close it, which releases the lock.
			_ = conn.Hijack().Close(uctx)
			return
		}
		conn.Release()
	}()

	// The run's start as recorded comes from the database's clock, which
	// also stamps its end.
	state, err := q.GetSweeperCursor(runCtx, db.GetSweeperCursorParams{Source: s.cfg.Source, Hook: s.hook})
	if err != nil {
		return Result{}, fmt.Errorf("ghsweep: read sweeper state: %w", err)
	}
	res, newest, runErr := s.sweep(ctx, runCtx, q, state.CursorDeliveryID)
	if res.CutShort != "" {
		runErr = errors.Join(fmt.Errorf("ghsweep: run cut short: %s", res.CutShort), runErr)
	}

	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var lastErr pgtype.Text
	if runErr != nil {
		lastErr = pgtype.Text{String: storable(runErr.Error()), Valid: true}
	}
	if err := q.SaveSweeperRun(sctx, db.SaveSweeperRunParams{
		Source:           s.cfg.Source,
		Hook:             s.hook,
		StartedAt:        state.Now,
		CursorDeliveryID: newest,
		Deliveries:       int32(res.Deliveries),
		Failed:           int32(res.Failed),
		Settled:          int32(res.Settled),
		Redelivered:      int32(len(res.Redelivered)),
		LastError:        lastErr,
		CutShort:         pgtype.Text{String: res.CutShort, Valid: res.CutShort != ""},
	}); err != nil {
		runErr = errors.Join(runErr, fmt.Errorf("ghsweep: record run: %w", err))
	}
	attrs := []any{"deliveries", res.Deliveries, "new", res.New, "failed", res.Failed, "settled", res.Settled,
		"waiting", res.Waiting, "redelivered", len(res.Redelivered), "refused", res.Refused, "skipped", res.Skipped,
		"elapsed", time.Since(started).Round(time.Millisecond)}
	if res.CutShort != "" {
		attrs = append(attrs, "cut_short", res.CutShort)
	}
	if runErr != nil {
		s.log.Error("redelivery sweep failed", append(attrs, "err", runErr)...)
	} else {
		s.log.Info("redelivery sweep", attrs...)
	}
	return res, runErr
}

// cutBy returns why runCtx, the run's context, ended while ctx, the
// caller's, did not: one of the run's own deadlines, which cut the run
// short rather than fail it. It returns "" otherwise.
func cutBy(ctx, runCtx context.Context) string {
	if runCtx.Err() == nil || ctx.Err() != nil {
		return ""
	}
	return context.Cause(runCtx).Error()
}

// sweep does a locked run's work under runCtx, a context of ctx that the
// run's deadline ends, and returns the newest delivery id listed. A run cut
// short says why in Result.CutShort; its error is then only what went wrong
// before.
func (s *Sweeper) sweep(ctx, runCtx context.Context, q *db.Queries, cursor int64) (Result, int64, error) {
	res := Result{Redelivered: []string{}}
	c := s.client()
	guids, newest, err := s.list(ctx, runCtx, c, cursor, &res)
	if err != nil {
		return res, newest, err
	}

	var failed []*guidState
	for _, g := range guids {
		if !g.ok {
			failed = append(failed, g)
		}
	}
	slices.SortFunc(failed, func(a, b *guidState) int {
		return cmp.Or(a.firstFailed.Compare(b.firstFailed), cmp.Compare(a.guid, b.guid))
	})
	res.Failed = len(failed)
	skip := map[string]bool{} // settled or in flight
	for chunk := range slices.Chunk(failed, 500) {
		keys := make([]string, len(chunk))
		for i, g := range chunk {
			keys[i] = g.guid
		}
		rows, err := q.SettledOrInFlightKeys(runCtx, db.SettledOrInFlightKeysParams{Source: s.cfg.Source, Keys: keys})
		if err != nil {
			if why := cutBy(ctx, runCtx); why != "" {
				res.CutShort = cmp.Or(res.CutShort, why)
				return res, newest, nil
			}
			return res, newest, fmt.Errorf("ghsweep: read settled keys: %w", err)
		}
		for _, r := range rows {
			skip[r.EventKey] = true
			if r.Settled {
				res.Settled++
			} else {
				res.InFlight++
			}
		}
	}

	var refused []error
	for _, g := range failed {
		if skip[g.guid] {
			continue
		}
		if why := cutBy(ctx, runCtx); why != "" {
			res.CutShort = cmp.Or(res.CutShort, why)
			break
		}
		redelivered, err := s.redeliver(runCtx, q, c, g)
		if why := cutBy(ctx, runCtx); err != nil && why != "" {
			res.CutShort = cmp.Or(res.CutShort, why)
			break
		}
		var apiErr *APIError
		switch {
		case err == nil && redelivered:
			res.Redelivered = append(res.Redelivered, g.guid)
		case err == nil:
			res.Waiting++
		case errors.As(err, &apiErr) && !apiErr.fatal():
			res.Refused++
			s.log.Warn("redelivery refused", "guid", g.guid, "delivery_id", g.newest, "err", err)
			if len(refused) < 10 {
				refused = append(refused, fmt.Errorf("redeliver %s: %w", g.guid, err))
			}
		default:
			return res, newest, err // rate limit, credential, network, database or cancellation: stop
		}
	}
	return res, newest, errors.Join(refused...)
}

// list reads the hook's deliveries of the window, page by page, and returns
// them by guid with the newest delivery id listed. It stops at the first
// page reaching past the window, and cuts the run short (res.CutShort) at
// a page already read, at MaxPages, or at half of RunTimeout.
func (s *Sweeper) list(ctx, runCtx context.Context, c *client, cursor int64, res *Result) (map[string]*guidState, int64, error) {
	listCtx, cancel := context.WithTimeoutCause(runCtx, s.cfg.RunTimeout/2,
		fmt.Errorf("the listing reached half of RunTimeout (%s)", s.cfg.RunTimeout/2))
	defer cancel()
	cutoff := time.Now().Add(-s.cfg.Window)
	guids := map[string]*guidState{}
	read := map[string]bool{}  // pages
	listed := map[int64]bool{} // delivery ids
	var newest int64
	for next, pages := s.listing.String(), 0; next != ""; pages++ {
		switch {
		case read[next]:
			res.CutShort = "the listing's next page link repeats a page already read"
			return guids, newest, nil
		case pages == s.cfg.MaxPages:
			res.CutShort = fmt.Sprintf("the listing reached MaxPages (%d pages) before the end of the window", s.cfg.MaxPages)
			return guids, newest, nil
		}
		read[next] = true
		var page []delivery
		var err error
		if next, err = c.get(listCtx, next, &page); err != nil {
			if why := cutBy(ctx, listCtx); why != "" {
				res.CutShort = why
				return guids, newest, nil
			}
			return guids, newest, err
		}
		older := false
		for _, d := range page {
			if d.DeliveredAt.Before(cutoff) {
				older = true // listed newest first: the rest of the listing is older
				continue
			}
			if listed[d.ID] {
				continue
			}
			listed[d.ID] = true
			res.Deliveries++
			if d.ID > cursor {
				res.New++
			}
			newest = max(newest, d.ID)
			if err := (txhook.Event{Source: s.cfg.Source, Key: d.GUID, Type: d.Event}).Validate(); err != nil {
				res.Skipped++
				s.log.Warn("listed delivery skipped: its guid or event cannot be an event's key or type",
					"guid", cut(d.GUID, 100), "event", cut(d.Event, 100), "delivery_id", d.ID, "err", err)
				continue
			}
			g := guids[d.GUID]
			if g == nil {
				g = &guidState{guid: d.GUID, event: d.Event}
				guids[d.GUID] = g
			}
			if d.ok() {
				g.ok = true
				continue
			}
			g.newest = max(g.newest, d.ID)
			if g.firstFailed.IsZero() || d.DeliveredAt.Before(g.firstFailed) {
				g.firstFailed = d.DeliveredAt
			}
		}
		if older || len(page) == 0 {
			break
		}
	}
	return guids, newest, nil
}

// redeliver records the redelivery of g and asks GitHub for it, unless a
// redelivery of it is already on its way (false, nil). A refusal is
// recorded and returned.
func (s *Sweeper) redeliver(ctx context.Context, q *db.Queries, c *client, g *guidState) (bool, error) {
	n, err := q.ClaimRedelivery(ctx, db.ClaimRedeliveryParams{
		Source:         s.cfg.Source,
		Guid:           g.guid,
		Hook:           s.hook,
		Event:          g.event,
		LastDeliveryID: g.newest,
		FirstFailedAt:  pgtype.Timestamptz{Time: g.firstFailed, Valid: true},
		ResendAfter:    pgtype.Interval{Microseconds: s.cfg.ResendAfter.Microseconds(), Valid: true},
		UnknownAfter:   pgtype.Interval{Microseconds: min(s.cfg.ResendAfter, unknownAfter).Microseconds(), Valid: true},
		Backoff:        pgtype.Interval{Microseconds: s.cfg.Backoff.Microseconds(), Valid: true},
	})
	if err != nil {
		return false, fmt.Errorf("ghsweep: record redelivery of %s: %w", g.guid, err)
	}
	if n == 0 {
		return false, nil
	}
	attempts := s.listing.JoinPath(strconv.FormatInt(g.newest, 10), "attempts")
	attempts.RawQuery = ""
	if err := c.post(ctx, attempts.String()); err != nil {
		if ctx.Err() != nil {
			// Cut by the run's deadline or the caller: whether GitHub got
			// the request is unknown. It stays requesting, asked for again
			// after unknownAfter.
			return false, err
		}
		mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if merr := q.MarkRedeliveryFailed(mctx, db.MarkRedeliveryFailedParams{
			Source: s.cfg.Source, Guid: g.guid, LastError: pgtype.Text{String: storable(err.Error()), Valid: true}}); merr != nil {
			// Not the refusal: a database that cannot record it stops the run.
			return false, fmt.Errorf("ghsweep: record refused redelivery of %s (%v): %w", g.guid, err, merr)
		}
		return false, err
	}
	// GitHub accepted: record it even past the run's deadline.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := q.MarkRedeliveryRequested(mctx, db.MarkRedeliveryRequestedParams{Source: s.cfg.Source, Guid: g.guid}); err != nil {
		return false, fmt.Errorf("ghsweep: record redelivery of %s: %w", g.guid, err)
	}
	s.log.Info("redelivery requested", "guid", g.guid, "event", g.event, "delivery_id", g.newest, "failed_at", g.firstFailed)
	return true, nil
}

// client returns a client for one run.
func (s *Sweeper) client() *client {
	c := &client{
		http:    s.cfg.HTTPClient,
		base:    s.listing,
		maxWait: s.cfg.MaxRateLimitWait,
		pause:   s.cfg.PostPause,
		now:     time.Now,
	}
	if s.appKey == nil {
		c.credential = func() (string, error) { return s.cfg.Token, nil }
		c.secret = func() []string { return []string{s.cfg.Token} }
		return c
	}
	var jwt string
	var made time.Time
	c.credential = func() (string, error) {
		if now := time.Now(); jwt == "" || now.Sub(made) > 5*time.Minute {
			t, err := appJWT(s.cfg.AppID, s.appKey, now)
			if err != nil {
				return "", fmt.Errorf("ghsweep: %w", err)
			}
			jwt, made = t, now
		}
		return jwt, nil
	}
	c.secret = func() []string { return []string{jwt} }
	return c
}

// RunEvery runs the sweeper now and then every interval until ctx ends,
// logging each run's result through Config.Logger. It is what an
// application without a job queue starts in a goroutine; several instances
// may each run it: the hook's lock makes their runs take turns. It returns
// when ctx ends.
func (s *Sweeper) RunEvery(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(max(interval, time.Second))
	defer t.Stop()
	for {
		_, _ = s.Run(ctx) // Run logs its result and its error
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
