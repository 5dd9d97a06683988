-- txhook_find_replay as 0002 created it: a wait past p_lock_timeout raises 55P03.
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
    PERFORM pg_advisory_xact_lock(hashtext(p_source), hashtext(encode(p_payload_hash, 'hex')));
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
