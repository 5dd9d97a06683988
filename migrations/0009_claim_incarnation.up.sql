-- txhook_claim_event also returns the claim's claimed_at (see below); 0003's version is replaced.
DROP FUNCTION txhook_claim_event(text, text, text, bytea, bytea, bigint, boolean, text);

-- txhook_claim_event is lease mode's claim in one round trip. It bounds the wait on a concurrent
-- writer of the same row with lock_timeout (restored afterwards) and either claims the key:
--   a new key is inserted in_progress with attempts 1;
--   an in_progress row whose lease has ended (expired, or released after a handler error) is
--   taken over: attempts + 1;
--   a failed row is taken over too when p_claim_failed is set (an operator's replay);
-- and returns claimed = true with the new fencing token (attempts) and the claim's claimed_at; or
-- returns the row as it is, claimed = false: status 'done' or 'failed' is a duplicate,
-- 'in_progress' is in flight for retry_after_ms more milliseconds. A transactional-mode 'done'
-- row is never claimed.
-- A lock wait past the bound raises SQLSTATE 55P03 (lock_not_available): in flight.
-- All times come from the database's clock, so instances need not agree on theirs.
-- claimed_at tells this claim from one of a later row under the same key: attempts starts again
-- at 1 when the row is deleted (a discarded dead letter, pruning) and the key is claimed anew, so
-- every write for the claim is conditional on both.
CREATE FUNCTION txhook_claim_event(
    p_source text,
    p_event_key text,
    p_event_type text,
    p_payload bytea,
    p_payload_hash bytea,
    p_lease_ms bigint,
    p_claim_failed boolean,
    p_lock_timeout text
) RETURNS TABLE (claimed boolean, status text, attempts integer, retry_after_ms bigint,
                claimed_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    saved_lock_timeout text := current_setting('lock_timeout');
    lease interval := p_lease_ms * interval '1 millisecond';
BEGIN
    IF p_lease_ms IS NULL OR p_lease_ms < 1 THEN
        RAISE EXCEPTION 'txhook_claim_event: lease must be at least 1 ms, got %', p_lease_ms
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM set_config('lock_timeout', p_lock_timeout, true);
    -- A row can vanish between the two statements only if it is pruned; try again then.
    FOR i IN 1..3 LOOP
        RETURN QUERY
        INSERT INTO txhook_processed_events AS e
            (source, event_key, event_type, status, attempts, claimed_at, lease_expires_at,
             payload, payload_hash)
        VALUES (p_source, p_event_key, p_event_type, 'in_progress', 1, clock_timestamp(),
                clock_timestamp() + lease, p_payload, p_payload_hash)
        ON CONFLICT (source, event_key) DO UPDATE
            SET status = 'in_progress',
                attempts = e.attempts + 1,
                claimed_at = clock_timestamp(),
                lease_expires_at = clock_timestamp() + lease,
                completed_at = NULL,
                payload = coalesce(e.payload, excluded.payload),
                payload_hash = coalesce(e.payload_hash, excluded.payload_hash)
            WHERE (e.status = 'in_progress' AND e.lease_expires_at <= clock_timestamp())
               OR (p_claim_failed AND e.status = 'failed')
        RETURNING true, e.status, e.attempts, 0::bigint, e.claimed_at;
        IF FOUND THEN
            PERFORM set_config('lock_timeout', saved_lock_timeout, true);
            RETURN;
        END IF;
        RETURN QUERY
        SELECT false, e.status, e.attempts,
               CASE WHEN e.status = 'in_progress' THEN
                   greatest(0, ceil(extract(epoch FROM e.lease_expires_at - clock_timestamp()) * 1000))::bigint
               ELSE 0::bigint END,
               e.claimed_at
        FROM txhook_processed_events e
        WHERE e.source = p_source AND e.event_key = p_event_key;
        IF FOUND THEN
            PERFORM set_config('lock_timeout', saved_lock_timeout, true);
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'txhook_claim_event: row for (%, %) keeps vanishing', p_source, p_event_key;
END
$$;
