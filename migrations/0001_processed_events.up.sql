-- txhook's dedupe table. One row per (source, event key): the receiving endpoint's name and the
-- provider's stable event id. In transactional mode a row is inserted with status 'done' in the
-- same transaction as the handler's business writes, so it exists only if they committed.
-- Lease mode uses the same row as a state machine: in_progress (claimed, lease running) ->
-- done, or -> failed (permanent error, kept for an operator to replay).
CREATE TABLE txhook_processed_events (
    source           text        NOT NULL,
    event_key        text        NOT NULL,
    event_type       text        NOT NULL DEFAULT '',
    status           text        NOT NULL,
    -- attempts counts claims; in lease mode it is the fencing token of the current claim.
    attempts         integer     NOT NULL DEFAULT 1,
    created_at       timestamptz NOT NULL DEFAULT now(),
    claimed_at       timestamptz NOT NULL DEFAULT now(),
    lease_expires_at timestamptz,
    completed_at     timestamptz,
    last_error       text,
    payload          bytea,
    -- SHA-256 of the signed body, for the replay guard of providers whose ids are unsigned.
    payload_hash     bytea,
    PRIMARY KEY (source, event_key),
    CONSTRAINT txhook_processed_events_status_check
        CHECK (status IN ('in_progress', 'done', 'failed')),
    CONSTRAINT txhook_processed_events_attempts_check CHECK (attempts > 0),
    CONSTRAINT txhook_processed_events_lease_check
        CHECK (status <> 'in_progress' OR lease_expires_at IS NOT NULL),
    CONSTRAINT txhook_processed_events_completed_check
        CHECK (status = 'in_progress' OR completed_at IS NOT NULL)
);

-- txhook_insert_event is the transactional mode's dedupe step in one round trip. It bounds the
-- wait on a concurrent delivery of the same key with lock_timeout (restored afterwards, so the
-- handler's own statements keep the caller's setting) and returns:
--   one row with status 'done'        the key is new: this transaction owns it;
--   one row with status 'in_progress' a lease-mode claim holds the key: in flight;
--   no row                            the key is done or failed: a duplicate.
-- A lock wait past the bound raises SQLSTATE 55P03 (lock_not_available): in flight.
-- A duplicate takes no row lock and writes nothing: the insert does nothing on conflict, and the
-- status is then read in a new snapshot (a VOLATILE function's statements each take one under
-- READ COMMITTED), which sees the row that the insert waited for.
CREATE FUNCTION txhook_insert_event(
    p_source text,
    p_event_key text,
    p_event_type text,
    p_payload bytea,
    p_payload_hash bytea,
    p_lock_timeout text
) RETURNS TABLE (status text, lease_expires_at timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    saved_lock_timeout text := current_setting('lock_timeout');
BEGIN
    PERFORM set_config('lock_timeout', p_lock_timeout, true);
    RETURN QUERY
    INSERT INTO txhook_processed_events AS e
        (source, event_key, event_type, status, completed_at, payload, payload_hash)
    VALUES (p_source, p_event_key, p_event_type, 'done', now(), p_payload, p_payload_hash)
    ON CONFLICT (source, event_key) DO NOTHING
    RETURNING e.status, e.lease_expires_at;
    IF FOUND THEN
        PERFORM set_config('lock_timeout', saved_lock_timeout, true);
        RETURN;
    END IF;
    PERFORM set_config('lock_timeout', saved_lock_timeout, true);
    RETURN QUERY
    SELECT e.status, e.lease_expires_at
    FROM txhook_processed_events AS e
    WHERE e.source = p_source AND e.event_key = p_event_key AND e.status = 'in_progress';
END
$$;
