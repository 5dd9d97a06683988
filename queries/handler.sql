-- name: LockAndFindPayloadHash :one
-- The body dedupe's check, in the transaction that records the delivery (or claims it, or accepts
-- it into the inbox); see txhook_find_replay in migrations. Returns '' when no other key has the
-- hash.
SELECT coalesce(txhook_find_replay(
    sqlc.arg(source)::text,
    sqlc.arg(payload_hash)::bytea,
    sqlc.arg(event_key)::text,
    sqlc.arg(window_seconds)::double precision,
    sqlc.arg(lock_timeout)::text
), '')::text AS event_key;
