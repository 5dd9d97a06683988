-- name: ClaimEvent :one
-- Lease mode's claim; see txhook_claim_event in migrations.
SELECT claimed::boolean AS claimed, status::text AS status, attempts::integer AS attempts,
       retry_after_ms::bigint AS retry_after_ms, claimed_at::timestamptz AS claimed_at
FROM txhook_claim_event(
    sqlc.arg(source)::text,
    sqlc.arg(event_key)::text,
    sqlc.arg(event_type)::text,
    sqlc.narg(payload)::bytea,
    sqlc.narg(payload_hash)::bytea,
    sqlc.arg(lease_ms)::bigint,
    sqlc.arg(claim_failed)::boolean,
    sqlc.arg(lock_timeout)::text
);

-- name: RenewLease :execrows
-- Extends the claim held with fencing token attempts, made at claimed_at (which tells it from a
-- claim of a later row under the same key); no row: the claim is lost. Leaves claimed_at as is.
UPDATE txhook_processed_events
SET lease_expires_at = clock_timestamp() + sqlc.arg(lease_ms)::bigint * interval '1 millisecond'
WHERE source = @source AND event_key = @event_key
  AND status = 'in_progress' AND attempts = @attempts AND claimed_at = @claimed_at;

-- name: CompleteLease :execrows
-- Marks the claim held with fencing token attempts, made at claimed_at, done; no row: the claim is
-- lost.
UPDATE txhook_processed_events
SET status = 'done', completed_at = clock_timestamp(), lease_expires_at = NULL
WHERE source = @source AND event_key = @event_key
  AND status = 'in_progress' AND attempts = @attempts AND claimed_at = @claimed_at;

-- name: ReleaseLease :execrows
-- Ends the claim held with fencing token attempts, made at claimed_at, at once, recording why, so
-- that the next delivery can claim the key without waiting for the lease to run out.
UPDATE txhook_processed_events
SET lease_expires_at = clock_timestamp(), last_error = @last_error
WHERE source = @source AND event_key = @event_key
  AND status = 'in_progress' AND attempts = @attempts AND claimed_at = @claimed_at;

-- name: FailLease :execrows
-- Records the claim held with fencing token attempts, made at claimed_at, as failed for good (a
-- permanent error), with the payload when the claim did not store it, so that the dead letter
-- can be replayed.
UPDATE txhook_processed_events
SET status = 'failed', completed_at = clock_timestamp(), lease_expires_at = NULL,
    last_error = @last_error, payload = coalesce(payload, sqlc.narg(payload)::bytea)
WHERE source = @source AND event_key = @event_key
  AND status = 'in_progress' AND attempts = @attempts AND claimed_at = @claimed_at;
