-- name: CheckKeyNotRecorded :exec
-- Inbox mode's accept, before the job's insert: fails with SQLSTATE P0T01 when the key is already
-- recorded in any state, so that the statements sent after it in the same round trip are skipped;
-- for a new key it finds no row and does nothing. See txhook_raise_key_recorded in migrations.
SELECT txhook_raise_key_recorded(source, event_key)
FROM txhook_processed_events
WHERE source = @source AND event_key = @event_key;

-- name: QueueEventWithJob :exec
-- Inbox mode's accept step, sent with COMMIT after the job that applies the event: inserts the key
-- as queued with its payload, payload hash and the job's id, so the row is written once. Its wait
-- on a concurrent delivery of the key is bounded by @lock_timeout, which the subquery sets before
-- the row is inserted; nothing runs after it but COMMIT, so the session's own setting needs no
-- restore. A key recorded meanwhile (CheckKeyNotRecorded, sent with BEGIN, saw none) fails it with
-- a unique violation of the events table's primary key, a concurrent delivery holding the key past
-- the bound with SQLSTATE 55P03; either aborts the transaction, so COMMIT never runs and the job
-- rolls back with it.
INSERT INTO txhook_processed_events (source, event_key, event_type, status, payload, payload_hash, job_id)
SELECT @source::text, @event_key::text, @event_type::text, 'queued', sqlc.narg(payload)::bytea,
       sqlc.narg(payload_hash)::bytea, sqlc.arg(job_id)::bigint
FROM (SELECT set_config('lock_timeout', @lock_timeout::text, true) AS bound) AS b;

-- name: LockQueuedEvent :one
-- Locks an event for its job, waiting for a concurrent apply of the same event to end, and
-- returns what the job needs to apply it. No row: the event is gone (pruned or deleted).
SELECT status, event_type, payload, payload_hash, lease_expires_at
FROM txhook_processed_events
WHERE source = @source AND event_key = @event_key
FOR UPDATE;

-- name: MarkQueuedDone :execrows
-- Marks a queued event done; its payload is kept only when keep_payload is set. attempt is the
-- queue's number of the try that applied it (0: unknown), which attempts then shows.
UPDATE txhook_processed_events
SET status = 'done', completed_at = now(), attempts = greatest(attempts, @attempt::integer),
    payload = CASE WHEN @keep_payload::boolean THEN payload END
WHERE source = @source AND event_key = @event_key AND status = 'queued';

-- name: RecordQueuedError :execrows
-- Records a failed try of a queued event that its job will retry: attempts becomes the queue's
-- number of the try (attempt), or counts one more try when the queue gives none (0).
UPDATE txhook_processed_events
SET attempts = CASE WHEN @attempt::integer > 0 THEN greatest(attempts, @attempt::integer) ELSE attempts + 1 END,
    last_error = @last_error
WHERE source = @source AND event_key = @event_key AND status = 'queued';

-- name: MarkQueuedFailed :execrows
-- Records a queued event as failed for good (a dead letter, replayable: its payload stays), after
-- the queue's try number attempt (0: unknown).
UPDATE txhook_processed_events
SET status = 'failed', completed_at = now(), attempts = greatest(attempts, @attempt::integer),
    last_error = @last_error
WHERE source = @source AND event_key = @event_key AND status = 'queued';

-- name: ClaimQueuedEvent :one
-- Inbox mode's claim for a lease-mode handler: takes a queued event (fencing token: its
-- attempts), or an in-progress one whose lease has ended (attempts + 1), for lease_ms, and returns
-- the claim's claimed_at, which lease mode's writes are conditional on too. The token is raised
-- to the queue's number of the try (attempt, 0: unknown) when that is higher, so that attempts
-- and the queue's count agree after a try that wrote nothing (its worker killed): it still grows
-- with every claim. No row: the event is settled, gone or held by a live claim.
UPDATE txhook_processed_events
SET status = 'in_progress',
    attempts = greatest(CASE WHEN status = 'queued' THEN attempts ELSE attempts + 1 END, @attempt::integer),
    claimed_at = clock_timestamp(),
    lease_expires_at = clock_timestamp() + sqlc.arg(lease_ms)::bigint * interval '1 millisecond'
WHERE source = @source AND event_key = @event_key
  AND (status = 'queued' OR (status = 'in_progress' AND lease_expires_at <= clock_timestamp()))
RETURNING attempts, claimed_at, event_type, payload, payload_hash;

-- name: QueueStats :one
-- The number of queued events and when the oldest of them was accepted.
SELECT count(*) AS queued, min(created_at)::timestamptz AS oldest,
       coalesce(extract(epoch FROM now() - min(created_at)) * 1000, 0)::bigint AS oldest_age_ms
FROM txhook_processed_events
WHERE status = 'queued';

-- name: FailStuckEvents :many
-- Records inbox mode's stuck events (see txhook_stuck_events: queued, or in progress with their
-- lease ended, whose queue job is gone, completed, discarded or cancelled) as failed: dead letters,
-- replayable (the payload stays), the reason in last_error, with the job's last error or else the
-- event's own. Either those of the given sources (NULL: any) or the one event source/event_key
-- names. The row must still name the job found ended, and still be queued or its lease ended,
-- once locked.
UPDATE txhook_processed_events AS e
SET status = 'failed', completed_at = now(), lease_expires_at = NULL,
    last_error = CASE WHEN s.job_state = 'gone'
                      THEN 'txhook: its queue job ' || s.job_id || ' was deleted before it applied the event'
                      ELSE 'txhook: its queue job ' || s.job_id || ' is ' || s.job_state || ' and never applied the event'
                 END || coalesce('; last error: ' || coalesce(s.job_error, e.last_error), '')
FROM txhook_stuck_events(sqlc.narg(river_schema)::text, sqlc.narg(source)::text, sqlc.narg(event_key)::text) AS s
WHERE e.source = s.source AND e.event_key = s.event_key AND e.job_id = s.job_id
  AND (e.status = 'queued' OR (e.status = 'in_progress' AND e.lease_expires_at <= now()))
  AND (sqlc.narg(sources)::text[] IS NULL OR e.source = ANY (sqlc.narg(sources)::text[]))
RETURNING e.source, e.event_key, e.event_type, e.job_id, e.last_error;
