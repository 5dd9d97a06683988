-- txhook_raise_key_recorded answers inbox mode's accept for a key that is already recorded, before
-- the job that would apply it is inserted. The accept sends
--     SELECT txhook_raise_key_recorded(source, event_key) FROM txhook_processed_events
--     WHERE source = $1 AND event_key = $2
-- with BEGIN, ahead of the queue's job insert, in one round trip: for a new key the index lookup
-- finds no row and the function never runs; for a recorded key (queued, in progress, done or
-- failed) it raises SQLSTATE P0T01, the code txhook_queue_event_with_job (0008) answers an
-- existing key with, and the server skips the statements after it in that round trip: no job is
-- inserted, the transaction writes nothing, and the delivery is answered as a duplicate. A key
-- being recorded by a concurrent delivery (not committed yet) is not seen here; the row's insert
-- sent with COMMIT still answers it, as before.
CREATE FUNCTION txhook_raise_key_recorded(p_source text, p_event_key text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION 'txhook: event key already recorded: %/%', p_source, p_event_key
        USING ERRCODE = 'P0T01';
END
$$;
