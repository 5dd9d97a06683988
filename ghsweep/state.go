package ghsweep

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/db"
)

// RunRecord is the last run of the sweeper on one hook, as recorded in the
// database.
type RunRecord struct {
	Source     string    `json:"source"`
	Hook       string    `json:"hook"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
	// NewestDeliveryID is the newest delivery id listed so far.
	NewestDeliveryID int64 `json:"newest_delivery_id"`
	// Deliveries, Failed, Settled and Redelivered are the last run's
	// counts (see Result).
	Deliveries  int `json:"deliveries"`
	Failed      int `json:"failed"`
	Settled     int `json:"settled"`
	Redelivered int `json:"redelivered"`
	// TotalRedelivered counts the redeliveries requested by every run.
	TotalRedelivered int64 `json:"total_redelivered"`
	// LastError is the last run's error, if it ended with one.
	LastError string `json:"last_error,omitempty"`
	// CutShort says why the last run was cut short (see Result.CutShort),
	// if it was.
	CutShort string `json:"cut_short,omitempty"`
}

// Redelivery is a guid whose redelivery the sweeper requested.
type Redelivery struct {
	Source string `json:"source"`
	GUID   string `json:"guid"`
	Hook   string `json:"hook"`
	Event  string `json:"event"`
	// DeliveryID is the newest delivery of the guid when it was requested.
	DeliveryID int64 `json:"delivery_id"`
	// Status is "requested" once GitHub accepted the request, "failed" when
	// GitHub refused it (LastError says why), or "requesting" while it is
	// being sent (or when its sender died meanwhile).
	Status        string    `json:"status"`
	Requests      int       `json:"requests"`
	FirstFailedAt time.Time `json:"first_failed_at"`
	RequestedAt   time.Time `json:"requested_at"`
	LastError     string    `json:"last_error,omitempty"`
}

// ListRuns returns the last run on every swept hook, by source and hook.
func ListRuns(ctx context.Context, q txhook.Querier) ([]RunRecord, error) {
	rows, err := db.New(q).ListSweeperRuns(ctx)
	if err != nil {
		return nil, fmt.Errorf("ghsweep: list sweeper runs: %w", err)
	}
	out := make([]RunRecord, len(rows))
	for i, r := range rows {
		out[i] = RunRecord{
			Source: r.Source, Hook: r.Hook, StartedAt: r.StartedAt.Time, FinishedAt: r.FinishedAt.Time,
			NewestDeliveryID: r.CursorDeliveryID, Deliveries: int(r.Deliveries), Failed: int(r.Failed),
			Settled: int(r.Settled), Redelivered: int(r.Redelivered), TotalRedelivered: r.TotalRedelivered,
			LastError: r.LastError.String, CutShort: r.CutShort.String,
		}
	}
	return out, nil
}

// ListRedeliveries returns up to limit (default 100) redeliveries, newest
// request first, of source or, when it is empty, of every source.
func ListRedeliveries(ctx context.Context, q txhook.Querier, source string, limit int) ([]Redelivery, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := db.New(q).ListRedeliveries(ctx, db.ListRedeliveriesParams{
		Source:  pgtype.Text{String: source, Valid: source != ""},
		MaxRows: int32(min(limit, 1<<30)),
	})
	if err != nil {
		return nil, fmt.Errorf("ghsweep: list redeliveries: %w", err)
	}
	out := make([]Redelivery, len(rows))
	for i, r := range rows {
		out[i] = Redelivery{
			Source: r.Source, GUID: r.Guid, Hook: r.Hook, Event: r.Event, DeliveryID: r.LastDeliveryID,
			Status: r.Status, Requests: int(r.Requests), FirstFailedAt: r.FirstFailedAt.Time,
			RequestedAt: r.RequestedAt.Time, LastError: r.LastError.String,
		}
	}
	return out, nil
}
