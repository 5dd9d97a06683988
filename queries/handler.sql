-- name: FindPayloadHash :one
-- The replay guard's lookup: another key of the same source whose signed body had the same hash,
-- recorded within the window. Served by txhook_processed_events_payload_hash_idx.
SELECT event_key FROM txhook_processed_events
WHERE source = @source
  AND payload_hash = @payload_hash
  AND event_key <> @event_key
  AND created_at > now() - make_interval(secs => sqlc.arg(window_seconds)::double precision)
LIMIT 1;

-- name: LockAndFindPayloadHash :one
-- The replay guard's check inside the delivery's own transaction; see txhook_find_replay in
-- migrations. Returns '' when no other key has the hash.
SELECT coalesce(txhook_find_replay(
    sqlc.arg(source)::text,
    sqlc.arg(payload_hash)::bytea,
    sqlc.arg(event_key)::text,
    sqlc.arg(window_seconds)::double precision,
    sqlc.arg(lock_timeout)::text
), '')::text AS event_key;
