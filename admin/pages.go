package admin

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/db"
)

// view is what every page's template gets.
type view struct {
	Title     string
	Nav       string
	CSRF      string
	Writes    bool
	CanReplay bool
	Data      any
}

var funcs = template.FuncMap{
	"time": formatTime,
	"ago":  ago,
	"eventURL": func(source, key string) string {
		return "event?" + url.Values{"source": {source}, "key": {key}}.Encode()
	},
	"id":    eventID,
	"short": func(s string, n int) string { return shorten(s, n) },
}

func parsePages() map[string]*template.Template {
	pages := map[string]*template.Template{}
	for _, name := range []string{"overview", "events", "event", "dead-letters", "result", "error"} {
		pages[name] = template.Must(template.New("layout.html").Funcs(funcs).
			ParseFS(assets, "templates/layout.html", "templates/"+name+".html"))
	}
	return pages
}

// render writes the page name with data, or an error page.
func (h *Handler) render(w http.ResponseWriter, r *http.Request, status int, name, nav, title string, data any) {
	v := view{
		Title: title, Nav: nav, CSRF: h.csrfToken(w, r), Writes: h.cfg.AllowWrites,
		CanReplay: h.cfg.AllowWrites && h.cfg.Processor != nil, Data: data,
	}
	var b bytes.Buffer
	if err := h.pages[name].Execute(&b, v); err != nil {
		h.cfg.Logger.Error("txhook console: render page", "page", name, "err", err)
		http.Error(w, "render page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	w.Write(b.Bytes())
}

// fail renders an error page.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, status int, err error) {
	msg := err.Error()
	if errors.Is(err, context.DeadlineExceeded) {
		msg = fmt.Sprintf("the query took longer than %v (Config.QueryTimeout): narrow the filters", h.cfg.QueryTimeout)
	}
	h.render(w, r, status, "error", "", http.StatusText(status), msg)
}

func (h *Handler) ctx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), h.cfg.QueryTimeout)
}

// --- overview ---

type sourceRow struct {
	Source                          string
	Done24h, Failed24h, DeadLetters int64
	InProgress                      int64
}

type bar struct {
	X, Y, W, H string
	Title      string
}

type chart struct {
	Bars          []bar
	Max, Total    int64
	From, To      string
	Hours         int
	Width, Height int
	EmptyMessage  string
}

type overviewData struct {
	Sources         []sourceRow
	DeadLetters     int64
	InProgress      int64
	Settled24h      int64
	EstimatedRows   int64
	Oldest          *db.OldestInProgressRow
	OldestLeaseLeft string
	Chart           chart
	Now             time.Time
	// Prune is the pruner's latest run, or nil when none ran.
	Prune *db.LastPruneRunRow
	// Queue is inbox mode's queue: events accepted and waiting for their
	// job. The page shows it only when Queued is not zero.
	Queue txhook.QueueStats
}

func (h *Handler) overview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := h.ctx(r)
	defer cancel()
	d, err := h.loadOverview(ctx)
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	h.render(w, r, http.StatusOK, "overview", "overview", "Overview", d)
}

func (h *Handler) loadOverview(ctx context.Context) (*overviewData, error) {
	q := db.New(h.db)
	est, err := q.AdminTableEstimate(ctx)
	if err != nil {
		return nil, fmt.Errorf("estimate table size: %w", err)
	}
	now := est.Now.Time
	d := &overviewData{EstimatedRows: est.Rows, Now: now}
	sources, err := q.AdminSources(ctx)
	if err != nil {
		return nil, fmt.Errorf("list sources: %w", err)
	}
	rows := map[string]*sourceRow{}
	for _, s := range sources {
		d.Sources = append(d.Sources, sourceRow{Source: s})
	}
	for i := range d.Sources {
		rows[d.Sources[i].Source] = &d.Sources[i]
	}
	open, err := q.AdminOpenCounts(ctx)
	if err != nil {
		return nil, fmt.Errorf("count open events: %w", err)
	}
	for _, c := range open {
		row := rows[c.Source]
		if row == nil {
			continue // created after the list of sources was read
		}
		switch c.Status {
		case statusFailed:
			row.DeadLetters, d.DeadLetters = c.Events, d.DeadLetters+c.Events
		case statusInProgress:
			row.InProgress, d.InProgress = c.Events, d.InProgress+c.Events
		}
	}
	settled, err := q.AdminSettledCountsSince(ctx, ts(now.Add(-24*time.Hour)))
	if err != nil {
		return nil, fmt.Errorf("count settled events: %w", err)
	}
	for _, c := range settled {
		d.Settled24h += c.Events
		if row := rows[c.Source]; row != nil {
			if c.Status == statusDone {
				row.Done24h = c.Events
			} else {
				row.Failed24h = c.Events
			}
		}
	}
	oldest, err := q.OldestInProgress(ctx)
	if err != nil {
		return nil, fmt.Errorf("find oldest in-progress event: %w", err)
	}
	if len(oldest) > 0 {
		d.Oldest = &oldest[0]
		left := oldest[0].LeaseExpiresAt.Time.Sub(now).Round(time.Second)
		if left > 0 {
			d.OldestLeaseLeft = "lease ends in " + left.String()
		} else {
			d.OldestLeaseLeft = "lease ended " + (-left).String() + " ago: the next delivery takes it over"
		}
	}
	if d.Queue, err = txhook.ReadQueueStats(ctx, h.db); err != nil {
		return nil, err
	}
	runs, err := q.LastPruneRun(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the last prune run: %w", err)
	}
	if len(runs) > 0 {
		d.Prune = &runs[0]
	}
	d.Chart, err = h.loadChart(ctx, q, now)
	return d, err
}

func (h *Handler) loadChart(ctx context.Context, q *db.Queries, now time.Time) (chart, error) {
	const width, height = 720, 140
	end := now.Truncate(time.Minute)
	n := h.cfg.ChartHours * 60
	start := end.Add(-time.Duration(n-1) * time.Minute)
	per, err := q.AdminSettledPerMinute(ctx, ts(start))
	if err != nil {
		return chart{}, fmt.Errorf("count events per minute: %w", err)
	}
	counts := make([]int64, n)
	c := chart{Hours: h.cfg.ChartHours, Width: width, Height: height,
		From: start.UTC().Format("15:04"), To: end.UTC().Format("15:04") + " UTC"}
	for _, p := range per {
		i := int(p.Minute.Time.Sub(start) / time.Minute)
		if i >= 0 && i < n {
			counts[i] += p.Events
			c.Total += p.Events
			c.Max = max(c.Max, counts[i])
		}
	}
	if c.Max == 0 {
		c.EmptyMessage = fmt.Sprintf("no event settled in the last %d hours", h.cfg.ChartHours)
		return c, nil
	}
	bw := float64(width) / float64(n)
	top := 4.0
	for i, v := range counts {
		if v == 0 {
			continue
		}
		bh := (float64(height) - top) * float64(v) / float64(c.Max)
		c.Bars = append(c.Bars, bar{
			X: fmt.Sprintf("%.2f", float64(i)*bw), Y: fmt.Sprintf("%.2f", float64(height)-bh),
			W: fmt.Sprintf("%.2f", max(bw-0.5, 0.5)), H: fmt.Sprintf("%.2f", bh),
			Title: fmt.Sprintf("%s UTC: %d events", start.Add(time.Duration(i)*time.Minute).UTC().Format("15:04"), v),
		})
	}
	return c, nil
}

// --- events ---

type filters struct {
	Source, Status, Type, Since string
}

func (f filters) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"source": f.Source, "status": f.Status, "type": f.Type, "since": f.Since} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

type listData struct {
	Filters  filters
	Sources  []string
	Statuses [][2]string
	Events   []txhook.EventRecord
	// TimeColumn names the column the list is ordered by.
	TimeColumn string
	Next       string
	First      string
	IsFirst    bool
}

func (h *Handler) events(w http.ResponseWriter, r *http.Request) {
	f := filters{Source: r.FormValue("source"), Status: r.FormValue("status"), Type: r.FormValue("type"), Since: r.FormValue("since")}
	h.list(w, r, f, "events", "events", "Events")
}

func (h *Handler) deadLetters(w http.ResponseWriter, r *http.Request) {
	f := filters{Source: r.FormValue("source"), Status: statusFailed, Type: r.FormValue("type"), Since: r.FormValue("since")}
	h.list(w, r, f, "dead-letters", "dead-letters", "Dead letters")
}

func (h *Handler) list(w http.ResponseWriter, r *http.Request, f filters, page, nav, title string) {
	switch f.Status {
	case "", statusDone, statusFailed, statusInProgress, statusQueued, statusStuck:
	default:
		h.fail(w, r, http.StatusBadRequest, fmt.Errorf("unknown status %q: want done, failed, in_progress, queued or stuck", f.Status))
		return
	}
	ctx, cancel := h.ctx(r)
	defer cancel()
	q := db.New(h.db)
	est, err := q.AdminTableEstimate(ctx)
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, fmt.Errorf("read the clock: %w", err))
		return
	}
	since := time.Unix(0, 0)
	if f.Since != "" {
		if since, err = parseSince(f.Since, est.Now.Time); err != nil {
			h.fail(w, r, http.StatusBadRequest, fmt.Errorf("since: %w", err))
			return
		}
	}
	cur, err := parseCursor(r)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err)
		return
	}
	limit := int32(h.cfg.PageSize + 1) // one more: is there a next page?
	d := listData{Filters: f, TimeColumn: "completed", IsFirst: cur.isFirst()}
	pp := db.AdminSettledPageParams{
		Status: f.Status, Source: f.Source, EventType: f.Type, Since: ts(since),
		BeforeAt: cur.at, BeforeSource: cur.source, BeforeKey: cur.key, MaxRows: limit,
	}
	var rows []db.AdminSettledPageRow
	switch f.Status {
	case statusFailed, statusInProgress:
		d.TimeColumn = "created"
		rows, err = pageRows(q.AdminOpenPage(ctx, db.AdminOpenPageParams(pp)))
	case statusQueued:
		d.TimeColumn = "created"
		rows, err = pageRows(q.AdminQueuedPage(ctx, db.AdminQueuedPageParams{Source: pp.Source, EventType: pp.EventType,
			Since: pp.Since, BeforeAt: pp.BeforeAt, BeforeSource: pp.BeforeSource, BeforeKey: pp.BeforeKey, MaxRows: pp.MaxRows}))
	case statusStuck:
		d.TimeColumn = "created"
		rows, err = pageRows(q.AdminStuckPage(ctx, db.AdminStuckPageParams{Source: pp.Source, EventType: pp.EventType,
			Since: pp.Since, BeforeAt: pp.BeforeAt, BeforeSource: pp.BeforeSource, BeforeKey: pp.BeforeKey, MaxRows: pp.MaxRows}))
	default:
		rows, err = q.AdminSettledPage(ctx, pp)
	}
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, fmt.Errorf("list events: %w", err))
		return
	}
	var evs []txhook.EventRecord
	for _, e := range rows {
		evs = append(evs, record(e))
	}
	if len(evs) > h.cfg.PageSize {
		evs = evs[:h.cfg.PageSize]
		last := evs[len(evs)-1]
		at := last.CompletedAt
		if d.TimeColumn == "created" {
			at = last.CreatedAt
		}
		v := f.values()
		if page == "dead-letters" {
			v.Del("status")
		}
		v.Set("before_at", at.UTC().Format(time.RFC3339Nano))
		v.Set("before_source", last.Source)
		v.Set("before_key", last.Key)
		d.Next = page + "?" + v.Encode()
	}
	v := f.values()
	if page == "dead-letters" {
		v.Del("status")
	}
	d.First = page
	if len(v) > 0 {
		d.First += "?" + v.Encode()
	}
	for i := range evs {
		evs[i].LastError = h.shownError(evs[i].LastError)
	}
	d.Events = evs
	if d.Sources, err = q.AdminSources(ctx); err != nil {
		h.fail(w, r, http.StatusInternalServerError, fmt.Errorf("list sources: %w", err))
		return
	}
	d.Statuses = [][2]string{{"", "done or failed"}, {"done", "done"}, {"failed", "failed"}, {"in_progress", "in progress"},
		{"queued", "queued (inbox)"}, {statusStuck, "stuck: nothing will apply them"}}
	h.render(w, r, http.StatusOK, page, nav, title, d)
}

// statusStuck is the events page's filter of stuck events: queued or in
// progress, and nothing will apply them (txhook.EventFilter.Stuck).
const statusStuck = "stuck"

type cursor struct {
	at          pgtype.Timestamptz
	source, key string
}

func (c cursor) isFirst() bool { return c.at.InfinityModifier == pgtype.Infinity }

// parseCursor reads the keyset cursor of a page after the first: the time,
// source and key of the previous page's last event.
func parseCursor(r *http.Request) (cursor, error) {
	s := r.FormValue("before_at")
	if s == "" {
		return cursor{at: pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return cursor{}, fmt.Errorf("before_at: want an RFC 3339 time, got %q", s)
	}
	return cursor{at: ts(t), source: r.FormValue("before_source"), key: r.FormValue("before_key")}, nil
}

// pageRows returns the rows of a page query as AdminSettledPage's, whose
// columns they share.
func pageRows[R db.AdminOpenPageRow | db.AdminQueuedPageRow | db.AdminStuckPageRow](rows []R, err error) ([]db.AdminSettledPageRow, error) {
	out := make([]db.AdminSettledPageRow, len(rows))
	for i, r := range rows {
		out[i] = db.AdminSettledPageRow(r)
	}
	return out, err
}

func record(r db.AdminSettledPageRow) txhook.EventRecord {
	return txhook.EventRecord{
		Source: r.Source, Key: r.EventKey, Type: r.EventType, Status: txhook.Status(r.Status),
		Attempts: int(r.Attempts), CreatedAt: r.CreatedAt.Time, ClaimedAt: r.ClaimedAt.Time,
		LeaseExpiresAt: r.LeaseExpiresAt.Time, CompletedAt: r.CompletedAt.Time,
		LastError: r.LastError.String, HasPayload: r.HasPayload, PayloadSize: int(r.PayloadSize),
	}
}

// --- one event ---

type eventData struct {
	E           txhook.EventRecord
	Payload     string
	PayloadNote string
	// PayloadCut says that Payload is only the start of the payload, or is
	// empty.
	PayloadCut string
	// Download is the address of the payload's download, empty when there
	// is none to offer.
	Download     string
	LeaseLeft    string
	Now          time.Time
	HidePayloads bool
	// Stuck says why nothing will apply the event, when it is queued or in
	// progress and stuck (txhook.EventFilter.Stuck); a replay takes it over.
	Stuck string
}

func (h *Handler) event(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := h.ctx(r)
	defer cancel()
	source, key := r.FormValue("source"), r.FormValue("key")
	preview := int32(previewBytes)
	if h.cfg.HidePayloads {
		preview = 0 // not a byte of it is read
	}
	row, err := db.New(h.db).AdminEvent(ctx, db.AdminEventParams{Source: source, EventKey: key, PreviewBytes: preview})
	if errors.Is(err, pgx.ErrNoRows) {
		h.fail(w, r, http.StatusNotFound, fmt.Errorf("no event with source %q and key %q (never delivered, or pruned)", source, key))
		return
	}
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, fmt.Errorf("read event: %w", err))
		return
	}
	e := txhook.EventRecord{
		Source: row.Source, Key: row.EventKey, Type: row.EventType, Status: txhook.Status(row.Status),
		Attempts: int(row.Attempts), CreatedAt: row.CreatedAt.Time, ClaimedAt: row.ClaimedAt.Time,
		LeaseExpiresAt: row.LeaseExpiresAt.Time, CompletedAt: row.CompletedAt.Time,
		LastError: h.shownError(row.LastError.String), HasPayload: row.HasPayload, PayloadSize: int(row.PayloadSize),
		JobID: row.JobID.Int64,
	}
	d := eventData{E: e, Now: time.Now(), HidePayloads: h.cfg.HidePayloads}
	switch {
	case !e.HasPayload:
		d.PayloadNote = "not stored: replay needs the payload (txhook.Config.StorePayload)"
	case h.cfg.HidePayloads:
		d.PayloadNote = fmt.Sprintf("%s, hidden by the console's configuration", byteSize(e.PayloadSize))
	default:
		d.Payload, d.PayloadNote, d.PayloadCut = showPayload(row.Preview, e.PayloadSize)
		d.Download = payloadURL(source, key)
	}
	if e.Status == txhook.StatusInProgress && !e.LeaseExpiresAt.IsZero() {
		if left := time.Until(e.LeaseExpiresAt).Round(time.Second); left > 0 {
			d.LeaseLeft = "ends in " + left.String()
		} else {
			d.LeaseLeft = "ended " + (-left).String() + " ago"
		}
	}
	if e.Status == txhook.StatusQueued || e.Status == txhook.StatusInProgress {
		stuck, err := db.New(h.db).AdminStuckEvent(ctx, db.AdminStuckEventParams{Source: source, EventKey: key})
		if err != nil {
			h.fail(w, r, http.StatusInternalServerError, fmt.Errorf("check the event's job: %w", err))
			return
		}
		if len(stuck) > 0 {
			d.Stuck = stuckReason(stuck[0])
		}
	}
	h.render(w, r, http.StatusOK, "event", "events", "Event "+shorten(key, 40), d)
}

// stuckReason says why nothing will apply a stuck event.
func stuckReason(s db.AdminStuckEventRow) string {
	switch s.JobState {
	case "":
		return "its lease-mode claim was abandoned (the lease ended) and no job will take it over"
	case "gone":
		return fmt.Sprintf("its job %d was deleted before it applied the event", s.JobID)
	}
	return fmt.Sprintf("its job %d is %s and never applied the event", s.JobID, s.JobState)
}

// --- helpers ---

// The statuses of the events table, as its queries return them.
const (
	statusDone       = string(txhook.StatusDone)
	statusFailed     = string(txhook.StatusFailed)
	statusInProgress = string(txhook.StatusInProgress)
	statusQueued     = string(txhook.StatusQueued)
)

// errorHidden stands for an error's text with Config.HidePayloads.
const errorHidden = "hidden by the console's configuration (errors may quote payloads)"

// shownError is what the console shows and logs of an event's error: the
// text, or with Config.HidePayloads a note that it is hidden, since a
// handler's error often quotes the payload it failed on.
func (h *Handler) shownError(s string) string {
	if s == "" || !h.cfg.HidePayloads {
		return s
	}
	return errorHidden
}

func ts(t time.Time) pgtype.Timestamptz { return pgtype.Timestamptz{Time: t, Valid: true} }

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func ago(now, t time.Time) string {
	if t.IsZero() {
		return ""
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "in " + (-d).Round(time.Second).String()
	case d < time.Minute:
		return d.Round(time.Second).String() + " ago"
	case d < 48*time.Hour:
		return d.Round(time.Minute).String() + " ago"
	}
	return fmt.Sprintf("%d days ago", int(d.Hours()/24))
}

func shorten(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

// eventID encodes a source and key as one form value.
func eventID(source, key string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(source)) + "." + base64.RawURLEncoding.EncodeToString([]byte(key))
}

func parseEventID(id string) (source, key string, err error) {
	a, b, ok := strings.Cut(id, ".")
	s, err1 := base64.RawURLEncoding.DecodeString(a)
	k, err2 := base64.RawURLEncoding.DecodeString(b)
	if !ok || err1 != nil || err2 != nil {
		return "", "", fmt.Errorf("malformed event id %q", id)
	}
	return string(s), string(k), nil
}

// parseSince parses the time filter: an age before now (90m, 36h, 7d) or a
// date or RFC 3339 time.
func parseSince(s string, now time.Time) (time.Time, error) {
	const maxAge = 100 * 365 * 24 * time.Hour
	if days, ok := strings.CutSuffix(s, "d"); ok {
		var n int
		if _, err := fmt.Sscanf(days, "%d", &n); err == nil && fmt.Sprint(n) == days && n >= 0 && n <= 100*365 {
			return now.Add(-time.Duration(n) * 24 * time.Hour), nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 && d <= maxAge {
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if t, err := time.ParseInLocation(time.DateOnly, s, time.UTC); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("want an age (90m, 36h, 7d) or a time (2006-01-02, 2006-01-02T15:04:05Z), got %q", s)
}
