-- name: InsertEvent :exec
-- The transactional mode's dedupe step: one row inserted, the key is new and this transaction owns
-- it. A recorded key takes no row lock and writes nothing, and the statement fails with SQLSTATE
-- P0T01 (txhook_raise_key_recorded, as inbox mode's accept check; InFlightLease then tells in
-- flight from duplicate): the transaction is aborted, so the server skips every statement sent
-- after it in the same round trip, COMMIT included, and nothing can commit for that key. A
-- concurrent delivery of the key that has not committed makes it wait, at most @lock_timeout: the
-- statement bounds its own wait (the subquery saves the session's lock_timeout and sets the bound
-- before the row is inserted; a wait past it raises SQLSTATE 55P03, lock_not_available: in flight)
-- and restores the session's setting once the row is in (RETURNING), so that a new key's handler
-- runs under its own setting.
WITH inserted AS (
    INSERT INTO txhook_processed_events AS e
        (source, event_key, event_type, status, completed_at, payload, payload_hash)
    SELECT @source::text, @event_key::text, @event_type::text, 'done', now(),
           sqlc.narg(payload)::bytea, sqlc.narg(payload_hash)::bytea
    FROM (SELECT set_config('txhook.lock_timeout', current_setting('lock_timeout'), true) AS saved,
                 set_config('lock_timeout', @lock_timeout::text, true) AS bound) AS b
    ON CONFLICT (source, event_key) DO NOTHING
    RETURNING set_config('lock_timeout', current_setting('txhook.lock_timeout'), true)
)
SELECT txhook_raise_key_recorded(@source::text, @event_key::text)
WHERE NOT EXISTS (SELECT FROM inserted);

-- name: InFlightLease :one
-- The lease of a lease-mode claim holding the key, read after the dedupe step found the key
-- recorded, in a statement of its own: a statement's snapshot is taken before it waits, so the
-- insert could not see the row it waited for. No row: the key is done, failed or queued (or
-- deleted since), a duplicate.
SELECT lease_expires_at FROM txhook_processed_events
WHERE source = @source AND event_key = @event_key AND status = 'in_progress';

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
