-- Index for the HTTP handler's replay guard: looks up a source's events by the hash of their
-- signed body. Partial, so rows without a hash (providers whose ids are signed) cost nothing.
CREATE INDEX txhook_processed_events_payload_hash_idx
    ON txhook_processed_events (source, payload_hash)
    WHERE payload_hash IS NOT NULL;

-- txhook_find_replay is the replay guard's check inside the transaction that has just inserted
-- (p_source, p_event_key) with p_payload_hash. It first takes a transaction-level advisory lock on
-- (source, hash), so that concurrent deliveries of one body run this check one after another,
-- waiting at most p_lock_timeout for it (past that: SQLSTATE 55P03, the delivery is in flight;
-- the caller's lock_timeout is restored afterwards); then, in a new snapshot (a VOLATILE
-- function's statements each take one under READ COMMITTED), it returns another key of the source already recorded with that hash within the window, or
-- NULL. A delivery that waited for the lock thus sees the row of the one that committed first.
-- The two-integer lock space does not collide with single-bigint advisory locks.
CREATE FUNCTION txhook_find_replay(
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
