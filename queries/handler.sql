-- name: LockAndFindPayloadHash :one
-- The body dedupe's check, in the transaction that records the delivery (or claims it; inbox
-- mode's accept sends CheckBodyNotRecorded instead); see txhook_find_replay in migrations. Returns
-- '' when no other key has the hash.
SELECT coalesce(txhook_find_replay(
    sqlc.arg(source)::text,
    sqlc.arg(payload_hash)::bytea,
    sqlc.arg(event_key)::text,
    sqlc.arg(window_seconds)::double precision,
    sqlc.arg(lock_timeout)::text
), '')::text AS event_key;

-- name: CheckBodyNotRecorded :exec
-- The body dedupe's check for inbox mode's accept, sent ahead of the job's insert in the same round
-- trip: fails with SQLSTATE P0T03 (its DETAIL the other key) when another key has the hash, so that
-- the server skips the statements sent after it; P0T02 past the lock's bound. See
-- txhook_check_replay in migrations.
SELECT txhook_check_replay(
    sqlc.arg(source)::text,
    sqlc.arg(payload_hash)::bytea,
    sqlc.arg(event_key)::text,
    sqlc.arg(window_seconds)::double precision,
    sqlc.arg(lock_timeout)::text
);
