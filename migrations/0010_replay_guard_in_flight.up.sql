-- txhook_find_replay as 0002 created it, except that a wait for the advisory lock past
-- p_lock_timeout raises SQLSTATE P0T02 (the delivery is in flight) instead of 55P03
-- (lock_not_available): a statement sent with the dedupe step answers 55P03 when the step's own
-- bound cut its lock wait short, and the caller must tell that from the guard's wait running out.
CREATE OR REPLACE FUNCTION txhook_find_replay(
    p_source text,
    p_payload_hash bytea,
    p_event_key text,
    p_window_seconds double precision,
    p_lock_timeout text
) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    found_key text;
    saved_lock_timeout text := current_setting('lock_timeout');
BEGIN
    PERFORM set_config('lock_timeout', p_lock_timeout, true);
    BEGIN
        PERFORM pg_advisory_xact_lock(hashtext(p_source), hashtext(encode(p_payload_hash, 'hex')));
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'txhook_find_replay: a delivery of the same body holds its lock past %', p_lock_timeout
            USING ERRCODE = 'P0T02';
    END;
    PERFORM set_config('lock_timeout', saved_lock_timeout, true);
    SELECT e.event_key INTO found_key
    FROM txhook_processed_events AS e
    WHERE e.source = p_source
      AND e.payload_hash = p_payload_hash
      AND e.event_key <> p_event_key
      AND e.created_at > now() - make_interval(secs => p_window_seconds)
    LIMIT 1;
    RETURN found_key;
END
$$;
