package txhook

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/txhook/txhook/db"
)

// Status is the state of an event's row in the events table.
type Status string

// Statuses of a row in the events table, as EventRecord.Status reports them.
const (
	// StatusInProgress: a lease-mode delivery holds the event.
	StatusInProgress Status = statusInProgress
	// StatusDone: the event was processed (or replayed) and committed.
	StatusDone Status = statusDone
	// StatusFailed: the handler failed permanently; the event waits for a
	// replay (a dead letter).
	StatusFailed Status = statusFailed
	// StatusQueued: inbox mode accepted the event; its job has not applied
	// it yet.
	StatusQueued Status = statusQueued
)

// ErrEventNotFound is returned for a source and key with no row in the
// events table (never delivered, or pruned).
var ErrEventNotFound = errors.New("txhook: event not found")

// Querier runs statements. *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it,
// so the read-only operations below can also run inside a caller's
// transaction.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// EventRecord is one row of the events table, as operators see it.
type EventRecord struct {
	Source string `json:"source"`
	Key    string `json:"key"`
	Type   string `json:"type"`
	Status Status `json:"status"`
	// Attempts counts the tries of the event: the claims and replays of a
	// lease-mode event (its fencing token), the replays of a dead letter,
	// and for an inbox event its queue's tries (River's attempt of the try
	// that last wrote the row: a queued event not tried yet shows 1).
	Attempts  int       `json:"attempts"`
	CreatedAt time.Time `json:"created_at"`
	ClaimedAt time.Time `json:"claimed_at"`
	// LeaseExpiresAt is set while a lease-mode claim runs.
	LeaseExpiresAt time.Time `json:"lease_expires_at,omitzero"`
	// CompletedAt is when the event became done or failed.
	CompletedAt time.Time `json:"completed_at,omitzero"`
	// LastError is the error of the latest failed attempt.
	LastError string `json:"last_error,omitempty"`
	// HasPayload reports whether the payload is stored (Config.StorePayload),
	// which replay needs; PayloadSize is its length in bytes.
	HasPayload  bool `json:"has_payload"`
	PayloadSize int  `json:"payload_size"`
	// Payload is the stored payload. Only GetEventRecord fills it.
	Payload []byte `json:"-"`
	// JobID is the id of the queue job that applies the event in inbox
	// mode (River's job id), 0 for events of the other modes.
	JobID int64 `json:"job_id,omitzero"`
}

// EventFilter selects events for ListEvents; ListDeadLetters and
// Processor.ReplayFailed take its Source, Type and Limit. Empty fields do
// not filter.
type EventFilter struct {
	Source string
	// Key keeps the event with this key (of any source unless Source is
	// set).
	Key    string
	Status Status
	Type   string
	// Since keeps events created at or after it.
	Since time.Time
	// Stuck keeps only the events that nothing will apply any more: inbox
	// mode's events, queued or in progress with their lease ended, whose
	// River job is gone, completed, discarded or cancelled (see FailStuck;
	// River's table is the one the search path finds), and lease mode's
	// claims abandoned in progress with their lease ended (the worker died,
	// or released the claim after an error; the sender may still retry).
	// Processor.Replay replays any of them.
	Stuck bool
	// Limit bounds the number of events returned. Defaults to 100.
	Limit int
}

func limitOrDefault(n int) (int32, error) {
	switch {
	case n < 0 || n > 1<<30:
		return 0, fmt.Errorf("txhook: limit %d out of range", n)
	case n == 0:
		return 100, nil
	}
	return int32(n), nil
}

func checkStatus(s Status) error {
	switch s {
	case "", StatusQueued, StatusInProgress, StatusDone, StatusFailed:
		return nil
	}
	return fmt.Errorf("txhook: unknown status %q (want %s, %s, %s or %s)", s, StatusQueued, StatusInProgress, StatusDone, StatusFailed)
}

// ListEvents returns the events matching f, newest first.
func ListEvents(ctx context.Context, q Querier, f EventFilter) ([]EventRecord, error) {
	limit, err := limitOrDefault(f.Limit)
	if err != nil {
		return nil, err
	}
	if err := checkStatus(f.Status); err != nil {
		return nil, err
	}
	p := db.ListEventsParams{
		Source:    optText(f.Source),
		EventKey:  optText(f.Key),
		Status:    optText(string(f.Status)),
		EventType: optText(f.Type),
		Since:     pgtype.Timestamptz{Time: f.Since, Valid: !f.Since.IsZero()},
		MaxRows:   limit,
	}
	var rows []db.ListEventsRow
	if f.Stuck {
		var stuck []db.ListStuckEventsRow
		stuck, err = db.New(q).ListStuckEvents(ctx, db.ListStuckEventsParams(p))
		for _, r := range stuck {
			rows = append(rows, db.ListEventsRow(r))
		}
	} else {
		rows, err = db.New(q).ListEvents(ctx, p)
	}
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	out := make([]EventRecord, len(rows))
	for i, r := range rows {
		out[i] = recordFromListRow(r)
	}
	return out, nil
}

// ListDeadLetters returns failed events of f's Source and Type (its other
// filters are not used), oldest first, at most f.Limit of them, with their
// last error and attempt count.
func ListDeadLetters(ctx context.Context, q Querier, f EventFilter) ([]EventRecord, error) {
	limit, err := limitOrDefault(f.Limit)
	if err != nil {
		return nil, err
	}
	rows, err := db.New(q).ListFailedEvents(ctx, db.ListFailedEventsParams{
		Source:    optText(f.Source),
		EventType: optText(f.Type),
		MaxRows:   limit,
	})
	if err != nil {
		return nil, fmt.Errorf("list failed events: %w", err)
	}
	out := make([]EventRecord, len(rows))
	for i, r := range rows {
		out[i] = recordFromListRow(db.ListEventsRow(r))
	}
	return out, nil
}

// GetEventRecord returns the event with the given source and key, payload
// included, or an error matching ErrEventNotFound.
func GetEventRecord(ctx context.Context, q Querier, source, key string) (EventRecord, error) {
	r, err := db.New(q).GetEvent(ctx, db.GetEventParams{Source: source, EventKey: key})
	if errors.Is(err, pgx.ErrNoRows) {
		return EventRecord{}, fmt.Errorf("get event %s/%s: %w", source, key, ErrEventNotFound)
	}
	if err != nil {
		return EventRecord{}, fmt.Errorf("get event: %w", err)
	}
	return recordFromRow(r), nil
}

func recordFromListRow(r db.ListEventsRow) EventRecord {
	return EventRecord{
		Source: r.Source, Key: r.EventKey, Type: r.EventType, Status: Status(r.Status),
		Attempts: int(r.Attempts), CreatedAt: r.CreatedAt.Time, ClaimedAt: r.ClaimedAt.Time,
		LeaseExpiresAt: r.LeaseExpiresAt.Time, CompletedAt: r.CompletedAt.Time,
		LastError: r.LastError.String, HasPayload: r.HasPayload, PayloadSize: int(r.PayloadSize),
		JobID: r.JobID.Int64,
	}
}

func recordFromRow(r db.TxhookProcessedEvent) EventRecord {
	return EventRecord{
		Source: r.Source, Key: r.EventKey, Type: r.EventType, Status: Status(r.Status),
		Attempts: int(r.Attempts), CreatedAt: r.CreatedAt.Time, ClaimedAt: r.ClaimedAt.Time,
		LeaseExpiresAt: r.LeaseExpiresAt.Time, CompletedAt: r.CompletedAt.Time,
		LastError: r.LastError.String, HasPayload: r.Payload != nil, PayloadSize: len(r.Payload),
		Payload: r.Payload, JobID: r.JobID.Int64,
	}
}

// StatusCount is the number of events of one source in one status.
type StatusCount struct {
	Source string `json:"source"`
	Status Status `json:"status"`
	Events int64  `json:"events"`
}

// LeaseInfo describes an in-progress event's claim.
type LeaseInfo struct {
	Source         string    `json:"source"`
	Key            string    `json:"key"`
	Attempts       int       `json:"attempts"`
	ClaimedAt      time.Time `json:"claimed_at"`
	LeaseExpiresAt time.Time `json:"lease_expires_at"`
	// ClaimedAge is how long ago the claim was taken, and LeaseLeft how long
	// its lease has left (negative once it has ended), both on the
	// database's clock, which set the two times above.
	ClaimedAge time.Duration `json:"claimed_age"`
	LeaseLeft  time.Duration `json:"lease_left"`
}

// Stats summarises the events table.
type Stats struct {
	// Counts holds the number of events by source and status, sorted.
	Counts []StatusCount `json:"counts"`
	// Total, InProgress, Done and Failed add Counts up over all sources.
	Total      int64 `json:"total"`
	InProgress int64 `json:"in_progress"`
	Done       int64 `json:"done"`
	Failed     int64 `json:"failed"`
	// OldestInProgress is the in-progress event claimed longest ago, or nil.
	OldestInProgress *LeaseInfo `json:"oldest_in_progress,omitempty"`
	// Queue is inbox mode's queue: the events accepted and not yet applied.
	Queue QueueStats `json:"queue"`
}

// ReadStats counts the events by source and status and finds the oldest
// in-progress claim. It reads the whole table.
func ReadStats(ctx context.Context, q Querier) (Stats, error) {
	qs := db.New(q)
	counts, err := qs.CountEventsBySourceStatus(ctx)
	if err != nil {
		return Stats{}, fmt.Errorf("count events: %w", err)
	}
	s := Stats{Counts: make([]StatusCount, len(counts))}
	for i, c := range counts {
		s.Counts[i] = StatusCount{Source: c.Source, Status: Status(c.Status), Events: c.Events}
		s.Total += c.Events
		switch Status(c.Status) {
		case StatusInProgress:
			s.InProgress += c.Events
		case StatusDone:
			s.Done += c.Events
		case StatusFailed:
			s.Failed += c.Events
		}
	}
	oldest, err := qs.OldestInProgress(ctx)
	if err != nil {
		return Stats{}, fmt.Errorf("find oldest in-progress event: %w", err)
	}
	if len(oldest) > 0 {
		o := oldest[0]
		s.OldestInProgress = &LeaseInfo{
			Source: o.Source, Key: o.EventKey, Attempts: int(o.Attempts),
			ClaimedAt: o.ClaimedAt.Time, LeaseExpiresAt: o.LeaseExpiresAt.Time,
			ClaimedAge: time.Duration(o.ClaimedAgeMs) * time.Millisecond,
			LeaseLeft:  time.Duration(o.LeaseLeftMs) * time.Millisecond,
		}
	}
	if err := s.readQueue(ctx, q); err != nil {
		return Stats{}, err
	}
	return s, nil
}

func optText(s string) pgtype.Text {
	return pgtype.Text{String: s, Valid: s != ""}
}
