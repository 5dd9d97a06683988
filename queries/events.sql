-- name: InsertEvent :one
-- The transactional mode's dedupe step; see txhook_insert_event in migrations.
SELECT status::text AS status, lease_expires_at::timestamptz AS lease_expires_at
FROM txhook_insert_event(
    sqlc.arg(source)::text,
    sqlc.arg(event_key)::text,
    sqlc.arg(event_type)::text,
    sqlc.narg(payload)::bytea,
    sqlc.narg(payload_hash)::bytea,
    sqlc.arg(lock_timeout)::text
);

-- name: EventStatus :one
-- The key's status, read outside any transaction by the duplicate filter while most deliveries are
-- duplicates. No row: the key is new (or pruned).
SELECT status FROM txhook_processed_events
WHERE source = @source AND event_key = @event_key;

-- name: InsertFailedEvent :execrows
-- Records an event whose handler failed permanently, unless the key exists.
INSERT INTO txhook_processed_events
    (source, event_key, event_type, status, completed_at, last_error, payload, payload_hash)
VALUES (@source, @event_key, @event_type, 'failed', now(), @last_error, @payload, @payload_hash)
ON CONFLICT (source, event_key) DO NOTHING;

-- name: GetEvent :one
SELECT * FROM txhook_processed_events
WHERE source = @source AND event_key = @event_key;
