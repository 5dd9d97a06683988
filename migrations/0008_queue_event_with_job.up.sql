-- txhook_queue_event_with_job is inbox mode's accept step as the last statement before COMMIT,
-- sent in the same round trip: after the job that applies the event is inserted, it inserts the
-- key as queued with its payload, payload hash and the job's id, so the row is written once.
-- A statement sent with COMMIT cannot answer "exists" with a result the caller reads first, so
-- it answers with an error that aborts the transaction, and COMMIT (skipped after the error)
-- never runs: the job inserted before it rolls back with it.
--   - The key exists in any state (queued, in progress, done or failed): SQLSTATE P0T01, in
--     PL/pgSQL's class P0, a code of txhook's own. Not unique_violation (23505): that code also
--     comes from the application's or the queue's own unique indexes, and a conflict here is a
--     duplicate, not a failure.
--   - A concurrent delivery of the same key holds it past p_lock_timeout: SQLSTATE 55P03
--     (lock_not_available), in flight, as with txhook_queue_event.
-- The caller's lock_timeout is restored afterwards. txhook_queue_event (0006) stays for callers
-- of the older step.
CREATE FUNCTION txhook_queue_event_with_job(
    p_source text,
    p_event_key text,
    p_event_type text,
    p_payload bytea,
    p_payload_hash bytea,
    p_job_id bigint,
    p_lock_timeout text
) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    saved_lock_timeout text := current_setting('lock_timeout');
BEGIN
    PERFORM set_config('lock_timeout', p_lock_timeout, true);
    INSERT INTO txhook_processed_events
        (source, event_key, event_type, status, payload, payload_hash, job_id)
    VALUES (p_source, p_event_key, p_event_type, 'queued', p_payload, p_payload_hash, p_job_id)
    ON CONFLICT (source, event_key) DO NOTHING;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'txhook: event key already recorded: %/%', p_source, p_event_key
            USING ERRCODE = 'P0T01';
    END IF;
    PERFORM set_config('lock_timeout', saved_lock_timeout, true);
END
$$;
