-- Queries of the GitHub redelivery sweeper (package ghsweep).

-- name: TrySweeperLock :one
-- Takes the session-level advisory lock of one swept hook, or reports that another session
-- holds it. The two-integer lock space does not collide with single-bigint advisory locks.
SELECT pg_try_advisory_lock(hashtext('txhook_ghsweep'), hashtext(@name::text)) AS locked;

-- name: SweeperUnlock :one
SELECT pg_advisory_unlock(hashtext('txhook_ghsweep'), hashtext(@name::text)) AS unlocked;

-- name: SettledOrInFlightKeys :many
-- The keys among keys that are settled (done or failed) for source, or in flight: held by a
-- lease-mode claim whose lease has not ended (a redelivery would only be answered 409).
SELECT event_key, (status <> 'in_progress')::boolean AS settled
FROM txhook_processed_events
WHERE source = @source AND event_key = ANY(@keys::text[])
  AND (status <> 'in_progress' OR lease_expires_at > now());

-- name: ClaimRedelivery :execrows
-- Records that the guid is about to be redelivered (status 'requesting'), unless a redelivery
-- of it is already on its way: requested, and neither has GitHub made a newer attempt at it
-- since (a delivery id above last_delivery_id) nor has resend_after passed; or being requested
-- for less than unknown_after (a request whose sender died has an unknown outcome, and GitHub
-- attempts an accepted redelivery within seconds). Besides, a guid asked for before waits,
-- after its k-th request, backoff * 2^(k-1) (at most 6 hours) before it is asked for again:
-- a delivery the receiver keeps refusing is not asked for on every run.
-- One row affected: this caller asks GitHub; none: it does not. Two sweepers racing on one
-- guid serialise on the row.
INSERT INTO txhook_redeliveries AS r
    (source, guid, hook, event, last_delivery_id, status, first_failed_at, requested_at)
VALUES (@source, @guid, @hook, @event, @last_delivery_id, 'requesting', @first_failed_at, now())
ON CONFLICT (source, guid) DO UPDATE
    SET hook = excluded.hook,
        last_delivery_id = excluded.last_delivery_id,
        status = 'requesting',
        requests = r.requests + 1,
        requested_at = now(),
        last_error = NULL
    WHERE ((r.status = 'failed'
            OR r.last_delivery_id < excluded.last_delivery_id
            OR r.requested_at < now() - @resend_after::interval)
           AND r.requested_at < now() - least(sqlc.arg(backoff)::interval * power(2, least(r.requests - 1, 20)),
                                             interval '6 hours'))
       OR (r.status = 'requesting' AND r.requested_at < now() - @unknown_after::interval);

-- name: MarkRedeliveryRequested :exec
-- Records that GitHub accepted the redelivery request.
UPDATE txhook_redeliveries SET status = 'requested'
WHERE source = @source AND guid = @guid AND status = 'requesting';

-- name: MarkRedeliveryFailed :exec
-- Records that GitHub refused the redelivery request: the next run may ask again.
UPDATE txhook_redeliveries
SET status = 'failed', last_error = @last_error
WHERE source = @source AND guid = @guid;

-- name: SaveSweeperRun :exec
INSERT INTO txhook_sweeper_runs AS s
    (source, hook, started_at, finished_at, cursor_delivery_id, deliveries, failed, settled,
     redelivered, total_redelivered, last_error, cut_short)
VALUES (@source, @hook, @started_at, now(), @cursor_delivery_id, @deliveries, @failed, @settled,
        @redelivered::integer, @redelivered::integer, sqlc.narg(last_error), sqlc.narg(cut_short))
ON CONFLICT (source, hook) DO UPDATE
    SET started_at = excluded.started_at,
        finished_at = excluded.finished_at,
        cursor_delivery_id = greatest(s.cursor_delivery_id, excluded.cursor_delivery_id),
        deliveries = excluded.deliveries,
        failed = excluded.failed,
        settled = excluded.settled,
        redelivered = excluded.redelivered,
        total_redelivered = s.total_redelivered + excluded.redelivered,
        last_error = excluded.last_error,
        cut_short = excluded.cut_short;

-- name: GetSweeperCursor :one
-- The hook's cursor, and the database clock's time, which starts a run (its end is stamped by the
-- same clock).
SELECT coalesce(max(cursor_delivery_id), 0)::bigint AS cursor_delivery_id, now()::timestamptz AS now
FROM txhook_sweeper_runs WHERE source = @source AND hook = @hook;

-- name: ListSweeperRuns :many
SELECT * FROM txhook_sweeper_runs
ORDER BY source, hook;

-- name: ListRedeliveries :many
-- Redeliveries newest first, optionally of one source.
SELECT * FROM txhook_redeliveries
WHERE (sqlc.narg(source)::text IS NULL OR source = sqlc.narg(source)::text)
ORDER BY requested_at DESC, source, guid
LIMIT @max_rows::integer;
