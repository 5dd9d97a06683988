-- name: PruneCutoff :one
-- The prune cutoff on the database clock, which also stamps completed_at, and the clock's time,
-- which starts a run.
SELECT now()::timestamptz AS now, (now() - @older_than::interval)::timestamptz AS cutoff;

-- name: TryPruneLock :one
-- Takes the pruning advisory lock for the current transaction, or reports that
-- another transaction holds it.
SELECT pg_try_advisory_xact_lock(@lock_key::bigint) AS locked;

-- name: PruneBatch :execrows
-- Deletes up to batch_size done (and, with include_failed, failed) rows
-- completed before cutoff. In-progress rows are never selected. Rows locked by
-- a concurrent replay are skipped, not waited for. The rows are locked and
-- then deleted by their physical address (ctid), which keeps every batch a
-- TID scan: a join on the primary key turns into a hash join over the whole
-- table once batches are large. The rows are found through
-- txhook_processed_events_completed_at_idx, whose predicate (completed_at IS
-- NOT NULL) the bound on completed_at implies.
DELETE FROM txhook_processed_events
WHERE ctid = ANY (ARRAY(
    SELECT p.ctid
    FROM txhook_processed_events AS p
    WHERE p.status <> 'in_progress'
      AND (p.status = 'done' OR (@include_failed::boolean AND p.status = 'failed'))
      AND p.completed_at < @cutoff::timestamptz
    LIMIT @batch_size::integer
    FOR UPDATE SKIP LOCKED
));

-- name: CountPrunable :one
-- Counts the rows PruneBatch would delete.
SELECT count(*) AS rows
FROM txhook_processed_events
WHERE status <> 'in_progress'
  AND (status = 'done' OR (@include_failed::boolean AND status = 'failed'))
  AND completed_at < @cutoff::timestamptz;

-- name: ListEvents :many
-- Events newest first, optionally filtered; payloads are summarised, not read.
SELECT source, event_key, event_type, status, attempts, created_at, claimed_at,
       lease_expires_at, completed_at, last_error,
       (payload IS NOT NULL)::boolean AS has_payload,
       coalesce(octet_length(payload), 0)::integer AS payload_size, job_id
FROM txhook_processed_events
WHERE (sqlc.narg(source)::text IS NULL OR source = sqlc.narg(source)::text)
  AND (sqlc.narg(event_key)::text IS NULL OR event_key = sqlc.narg(event_key)::text)
  AND (sqlc.narg(status)::text IS NULL OR status = sqlc.narg(status)::text)
  AND (sqlc.narg(event_type)::text IS NULL OR event_type = sqlc.narg(event_type)::text)
  AND (sqlc.narg(since)::timestamptz IS NULL OR created_at >= sqlc.narg(since)::timestamptz)
ORDER BY created_at DESC, source, event_key
LIMIT @max_rows::integer;

-- name: ListFailedEvents :many
-- Failed events (dead letters) oldest first, optionally filtered.
SELECT source, event_key, event_type, status, attempts, created_at, claimed_at,
       lease_expires_at, completed_at, last_error,
       (payload IS NOT NULL)::boolean AS has_payload,
       coalesce(octet_length(payload), 0)::integer AS payload_size, job_id
FROM txhook_processed_events
WHERE status = 'failed'
  AND (sqlc.narg(source)::text IS NULL OR source = sqlc.narg(source)::text)
  AND (sqlc.narg(event_type)::text IS NULL OR event_type = sqlc.narg(event_type)::text)
ORDER BY created_at, source, event_key
LIMIT @max_rows::integer;

-- name: CountEventsBySourceStatus :many
SELECT source, status, count(*) AS events
FROM txhook_processed_events
GROUP BY source, status
ORDER BY source, status;

-- name: OldestInProgress :many
-- The in-progress row claimed longest ago, if any, with how long ago it was claimed and how long
-- its lease has left (negative: ended), on the database's clock.
SELECT source, event_key, attempts, claimed_at, lease_expires_at,
       (extract(epoch FROM now() - claimed_at) * 1000)::bigint AS claimed_age_ms,
       (extract(epoch FROM lease_expires_at - now()) * 1000)::bigint AS lease_left_ms
FROM txhook_processed_events
WHERE status = 'in_progress'
ORDER BY claimed_at, source, event_key
LIMIT 1;

-- name: LockFailedEvent :one
-- Locks a failed event for replay. A concurrent replay of the same event waits
-- here and, once the first commits, finds no failed row.
SELECT * FROM txhook_processed_events
WHERE source = @source AND event_key = @event_key AND status = 'failed'
FOR UPDATE;

-- name: MarkReplayed :execrows
-- Marks a locked failed event done after its replay succeeded.
UPDATE txhook_processed_events
SET status = 'done', completed_at = now(), last_error = NULL, attempts = attempts + 1
WHERE source = @source AND event_key = @event_key AND status = 'failed';

-- name: RecordReplayFailure :execrows
-- Keeps a locked failed event failed, with the error of its latest replay.
UPDATE txhook_processed_events
SET last_error = @last_error, completed_at = now(), attempts = attempts + 1
WHERE source = @source AND event_key = @event_key AND status = 'failed';

-- name: ListStuckEvents :many
-- Stuck events (see txhook_stuck_events) newest first, optionally filtered, as ListEvents returns
-- them.
SELECT e.source, e.event_key, e.event_type, e.status, e.attempts, e.created_at, e.claimed_at,
       e.lease_expires_at, e.completed_at, e.last_error,
       (e.payload IS NOT NULL)::boolean AS has_payload,
       coalesce(octet_length(e.payload), 0)::integer AS payload_size, e.job_id
FROM txhook_processed_events AS e
JOIN txhook_stuck_events(NULL, sqlc.narg(source)::text, sqlc.narg(event_key)::text) AS s
  ON s.source = e.source AND s.event_key = e.event_key
WHERE (sqlc.narg(status)::text IS NULL OR e.status = sqlc.narg(status)::text)
  AND (sqlc.narg(event_type)::text IS NULL OR e.event_type = sqlc.narg(event_type)::text)
  AND (sqlc.narg(since)::timestamptz IS NULL OR e.created_at >= sqlc.narg(since)::timestamptz)
ORDER BY e.created_at DESC, e.source, e.event_key
LIMIT @max_rows::integer;
