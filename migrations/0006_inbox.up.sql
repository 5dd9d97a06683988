-- Inbox mode: a verified delivery is stored (status 'queued', with its payload) together with a
-- job in the application's queue, answered 2xx after COMMIT, and applied later by the queue's
-- worker, which locks the row, runs the handler and marks the row done in one transaction.
-- A queued row is a key like any other: the transactional mode's dedupe step answers it as a
-- duplicate (txhook_insert_event inserts only on no conflict and reports only in_progress rows).
ALTER TABLE txhook_processed_events
    DROP CONSTRAINT txhook_processed_events_status_check,
    ADD CONSTRAINT txhook_processed_events_status_check
        CHECK (status IN ('queued', 'in_progress', 'done', 'failed')),
    DROP CONSTRAINT txhook_processed_events_completed_check,
    ADD CONSTRAINT txhook_processed_events_completed_check
        CHECK (status IN ('queued', 'in_progress') OR completed_at IS NOT NULL),
    -- The id of the queue job that applies a queued event (River's river_job.id).
    ADD COLUMN job_id bigint;

-- Queued rows oldest first, for the queue depth and the oldest queued event's age in stats.
-- Small: it holds only rows waiting for their job.
CREATE INDEX txhook_processed_events_queued_idx
    ON txhook_processed_events (created_at)
    WHERE status = 'queued';

-- txhook_queue_event is inbox mode's accept step in one round trip: it inserts the key as queued,
-- with its payload and payload hash, unless the key exists in any state. It bounds the wait on a
-- concurrent delivery of the same key with lock_timeout (restored afterwards) and returns true
-- when the key is new (this transaction owns it and must enqueue its job) and false when it
-- exists (queued, in progress, done or failed: a duplicate). A lock wait past the bound raises
-- SQLSTATE 55P03 (lock_not_available): in flight.
CREATE FUNCTION txhook_queue_event(
    p_source text,
    p_event_key text,
    p_event_type text,
    p_payload bytea,
    p_payload_hash bytea,
    p_lock_timeout text
) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    saved_lock_timeout text := current_setting('lock_timeout');
    inserted boolean;
BEGIN
    PERFORM set_config('lock_timeout', p_lock_timeout, true);
    INSERT INTO txhook_processed_events
        (source, event_key, event_type, status, payload, payload_hash)
    VALUES (p_source, p_event_key, p_event_type, 'queued', p_payload, p_payload_hash)
    ON CONFLICT (source, event_key) DO NOTHING;
    inserted := FOUND;
    PERFORM set_config('lock_timeout', saved_lock_timeout, true);
    RETURN inserted;
END
$$;
