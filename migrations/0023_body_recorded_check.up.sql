-- txhook_check_replay is the body dedupe's check as a statement that fails instead of returning
-- the other key: for inbox mode's accept, which sends it with BEGIN and the key's check
-- (txhook_raise_key_recorded, 0013) ahead of the queue's job insert, all in one round trip. It
-- runs txhook_find_replay (its lock, bounded by p_lock_timeout, past which SQLSTATE P0T02), and
-- when another key of the source has the body's hash it raises SQLSTATE P0T03 with that key as the
-- error's DETAIL: the transaction is aborted, the server skips the statements after it in that
-- round trip (the job's insert, the row's with COMMIT), and the delivery is answered as a replay.
CREATE FUNCTION txhook_check_replay(
    p_source text,
    p_payload_hash bytea,
    p_event_key text,
    p_window_seconds double precision,
    p_lock_timeout text
) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    found_key text := txhook_find_replay(p_source, p_payload_hash, p_event_key, p_window_seconds, p_lock_timeout);
BEGIN
    IF found_key IS NOT NULL THEN
        RAISE EXCEPTION 'txhook: body already recorded under another key: %/%', p_source, found_key
            USING ERRCODE = 'P0T03', DETAIL = found_key;
    END IF;
END
$$;
