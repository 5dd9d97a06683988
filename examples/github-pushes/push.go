package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txhook/txhook"
	"github.com/txhook/txhook/examples/github-pushes/pushesdb"
)

// pushEvent is the part of GitHub's push payload the example uses.
type pushEvent struct {
	Ref        string `json:"ref"`
	Before     string `json:"before"`
	After      string `json:"after"`
	Repository struct {
		FullName string `json:"full_name"`
	} `json:"repository"`
	Pusher struct {
		Name string `json:"name"`
	} `json:"pusher"`
	Commits []json.RawMessage `json:"commits"`
}

// push records a push delivery and counts it in its repository, through the
// example's queries bound to the delivery's transaction. The counters are
// not idempotent on their own: the delivery's key, committed in the same
// transaction, is what keeps them right. A payload that is not a push is a
// permanent error: it is recorded as failed, with its body, for replay.
func push(ctx context.Context, q *pushesdb.Queries, ev txhook.Event) error {
	var p pushEvent
	if err := json.Unmarshal(ev.Payload, &p); err != nil {
		return txhook.Permanent(fmt.Errorf("decode push: %w", err))
	}
	if p.Repository.FullName == "" || p.Ref == "" || p.After == "" {
		return txhook.Permanent(fmt.Errorf("push %s: missing repository, ref or after", ev.Key))
	}
	if _, err := q.InsertPush(ctx, pushesdb.InsertPushParams{
		DeliveryID:  ev.Key,
		Repository:  p.Repository.FullName,
		Ref:         p.Ref,
		BeforeSha:   p.Before,
		AfterSha:    p.After,
		Pusher:      p.Pusher.Name,
		CommitCount: int32(len(p.Commits)),
	}); err != nil {
		return fmt.Errorf("insert push: %w", err)
	}
	if _, err := q.CountPush(ctx, pushesdb.CountPushParams{
		FullName: p.Repository.FullName,
		Commits:  int64(len(p.Commits)),
		Ref:      p.Ref,
		HeadSha:  p.After,
	}); err != nil {
		return fmt.Errorf("count push: %w", err)
	}
	return nil
}

// failFirstTry returns h, except that the first try of the push whose after
// commit id is after fails (with an error that is not permanent), once per
// process: a forced failure for demonstrations of retries.
func failFirstTry(after string, h txhook.HandlerFunc) txhook.HandlerFunc {
	var failed atomic.Bool
	return func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		var p pushEvent
		if json.Unmarshal(ev.Payload, &p) == nil && p.After == after && failed.CompareAndSwap(false, true) {
			return fmt.Errorf("push %s: forced failure of the first try (FAIL_FIRST_TRY)", ev.Key)
		}
		return h(ctx, tx, ev)
	}
}

// delayTries returns h, except that each try waits d before it runs h (or
// fails when ctx ends first): for demonstrations of a crash in the middle of
// a job, which then comes after the delivery's answer is out.
func delayTries(d time.Duration, h txhook.HandlerFunc) txhook.HandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, ev txhook.Event) error {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return h(ctx, tx, ev)
		case <-ctx.Done():
			return fmt.Errorf("push %s: %w", ev.Key, context.Cause(ctx))
		}
	}
}
