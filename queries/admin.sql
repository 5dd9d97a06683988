-- Queries of the operator console (package admin). Each one reads through an index and stops
-- at a LIMIT or a time bound, so that a page costs the same on a table of millions of rows.

-- name: AdminSources :many
-- The distinct sources, by a loose index scan of the primary key: one index probe per source
-- instead of a scan of the table.
WITH RECURSIVE s AS (
    (SELECT e.source FROM txhook_processed_events AS e ORDER BY e.source LIMIT 1)
    UNION ALL
    SELECT (SELECT e.source FROM txhook_processed_events AS e
            WHERE e.source > s.source ORDER BY e.source LIMIT 1)
    FROM s
    WHERE s.source IS NOT NULL
)
SELECT s.source::text AS source FROM s WHERE s.source IS NOT NULL LIMIT 1000;

-- name: AdminOpenCounts :many
-- Failed and in-progress events by source and status, through txhook_processed_events_not_done_idx.
SELECT source, status, count(*) AS events
FROM txhook_processed_events
WHERE status IN ('failed', 'in_progress')
GROUP BY source, status
ORDER BY source, status;

-- name: AdminSettledCountsSince :many
-- Events settled (done or failed) since a time, by source and status, through
-- txhook_processed_events_completed_at_idx.
SELECT source, status, count(*) AS events
FROM txhook_processed_events
WHERE status <> 'in_progress' AND completed_at >= @since::timestamptz
GROUP BY source, status
ORDER BY source, status;

-- name: AdminSettledPerMinute :many
-- Events settled per minute since a time, on the database's clock, through
-- txhook_processed_events_completed_at_idx.
SELECT date_trunc('minute', completed_at)::timestamptz AS minute, count(*) AS events
FROM txhook_processed_events
WHERE status <> 'in_progress' AND completed_at >= @since::timestamptz
GROUP BY 1
ORDER BY 1;

-- name: AdminTableEstimate :one
-- The planner's estimate of the events table's rows: no scan.
SELECT coalesce((SELECT greatest(c.reltuples, 0)::bigint FROM pg_catalog.pg_class AS c
                 WHERE c.oid = to_regclass('txhook_processed_events')), 0)::bigint AS rows,
       now()::timestamptz AS now;

-- name: AdminSettledPage :many
-- One page of settled events (status done or failed, or both when status is empty), most
-- recently completed first, after the cursor (completed_at, source, event_key): keyset
-- pagination on txhook_processed_events_completed_at_idx. The first page passes 'infinity'.
SELECT source, event_key, event_type, status, attempts, created_at, claimed_at,
       lease_expires_at, completed_at, last_error,
       (payload IS NOT NULL)::boolean AS has_payload,
       coalesce(octet_length(payload), 0)::integer AS payload_size
FROM txhook_processed_events
WHERE status <> 'in_progress'
  AND (@status::text = '' OR status = @status::text)
  AND (@source::text = '' OR source = @source::text)
  AND (@event_type::text = '' OR event_type = @event_type::text)
  AND completed_at >= @since::timestamptz
  AND completed_at <= @before_at::timestamptz
  AND (completed_at, source, event_key) < (@before_at::timestamptz, @before_source::text, @before_key::text)
ORDER BY completed_at DESC, source DESC, event_key DESC
LIMIT @max_rows::integer;

-- name: AdminOpenPage :many
-- One page of failed or in-progress events (status is 'failed' or 'in_progress'), newest
-- first, after the cursor (created_at, source, event_key): keyset pagination on
-- txhook_processed_events_not_done_idx. The first page passes 'infinity'.
SELECT source, event_key, event_type, status, attempts, created_at, claimed_at,
       lease_expires_at, completed_at, last_error,
       (payload IS NOT NULL)::boolean AS has_payload,
       coalesce(octet_length(payload), 0)::integer AS payload_size
FROM txhook_processed_events
WHERE status IN ('failed', 'in_progress')
  AND status = @status::text
  AND (@source::text = '' OR source = @source::text)
  AND (@event_type::text = '' OR event_type = @event_type::text)
  AND created_at >= @since::timestamptz
  AND created_at <= @before_at::timestamptz
  AND (created_at, source, event_key) < (@before_at::timestamptz, @before_source::text, @before_key::text)
ORDER BY created_at DESC, source DESC, event_key DESC
LIMIT @max_rows::integer;

-- name: AdminEvent :one
-- One event for the console's event page, through the primary key: every column but the
-- payload, of which it returns the size and at most @preview_bytes from the start. substring
-- reads no more of a stored payload than the part it returns (a slice of the TOAST value), so a
-- page costs the same for a payload of 1 kB or 25 MB.
SELECT source, event_key, event_type, status, attempts, created_at, claimed_at,
       lease_expires_at, completed_at, last_error,
       (payload IS NOT NULL)::boolean AS has_payload,
       coalesce(octet_length(payload), 0)::integer AS payload_size,
       coalesce(substring(payload FROM 1 FOR @preview_bytes::integer), ''::bytea)::bytea AS preview,
       job_id
FROM txhook_processed_events
WHERE source = @source AND event_key = @event_key;

-- name: AdminDiscardFailed :execrows
-- Deletes a failed event (a dead letter an operator gave up on). Rows in any other status,
-- and a row a concurrent replay holds, are left alone.
DELETE FROM txhook_processed_events
WHERE ctid = (
    SELECT e.ctid FROM txhook_processed_events AS e
    WHERE e.source = @source AND e.event_key = @event_key AND e.status = 'failed'
    FOR UPDATE SKIP LOCKED
);

-- name: AdminQueuedPage :many
-- One page of inbox mode's queued events, newest first, after the cursor (created_at, source,
-- event_key): keyset pagination on txhook_processed_events_not_done_idx. The first page passes
-- 'infinity'.
SELECT source, event_key, event_type, status, attempts, created_at, claimed_at,
       lease_expires_at, completed_at, last_error,
       (payload IS NOT NULL)::boolean AS has_payload,
       coalesce(octet_length(payload), 0)::integer AS payload_size
FROM txhook_processed_events
WHERE status = 'queued'
  AND (@source::text = '' OR source = @source::text)
  AND (@event_type::text = '' OR event_type = @event_type::text)
  AND created_at >= @since::timestamptz
  AND created_at <= @before_at::timestamptz
  AND (created_at, source, event_key) < (@before_at::timestamptz, @before_source::text, @before_key::text)
ORDER BY created_at DESC, source DESC, event_key DESC
LIMIT @max_rows::integer;

-- name: AdminStuckPage :many
-- One page of stuck events (see txhook_stuck_events: queued or in progress, and nothing will
-- apply them), newest first, after the cursor (created_at, source, event_key).
SELECT e.source, e.event_key, e.event_type, e.status, e.attempts, e.created_at, e.claimed_at,
       e.lease_expires_at, e.completed_at, e.last_error,
       (e.payload IS NOT NULL)::boolean AS has_payload,
       coalesce(octet_length(e.payload), 0)::integer AS payload_size
FROM txhook_processed_events AS e
JOIN txhook_stuck_events(NULL, nullif(@source::text, ''), NULL) AS s
  ON s.source = e.source AND s.event_key = e.event_key
WHERE (@event_type::text = '' OR e.event_type = @event_type::text)
  AND e.created_at >= @since::timestamptz
  AND e.created_at <= @before_at::timestamptz
  AND (e.created_at, e.source, e.event_key) < (@before_at::timestamptz, @before_source::text, @before_key::text)
ORDER BY e.created_at DESC, e.source DESC, e.event_key DESC
LIMIT @max_rows::integer;

-- name: AdminStuckEvent :many
-- Why nothing will apply the event source/event_key (see txhook_stuck_events): its queue job and
-- the job's state ('gone' once deleted; 0 and '' for a lease-mode claim without a job). No row:
-- it is not stuck.
SELECT coalesce(s.job_id, 0)::bigint AS job_id, coalesce(s.job_state, '')::text AS job_state
FROM txhook_stuck_events(NULL, @source::text, @event_key::text) AS s;
