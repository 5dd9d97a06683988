-- txhook_stuck_events returns the events that nothing will apply any more ("stuck"), optionally
-- of one source and one key (NULL: any):
--   - in progress with their lease ended and no queue job (a lease-mode claim abandoned: its
--     worker died, or it released the claim after an error and the sender never retried);
--   - inbox mode's events, queued or in progress with their lease ended, whose queue job is gone
--     (deleted), completed, discarded or cancelled: River gave up on the job (its last attempt
--     ended by a killed worker or a fault, or an operator discarded, cancelled or deleted it), or
--     it ended without settling its event.
-- job_id is River's river_job.id: the queue job is looked up in p_river_schema's river_job (NULL
-- or '': the one the search path finds). Without that table, only the first kind is returned.
-- An event whose job is live (available, scheduled, retryable, running or pending) is never
-- stuck: its job applies it. job_state is the job's state ('gone' when deleted, NULL for the
-- first kind) and job_error the error of its last attempt, if any.
-- Through indexes only: the partial indexes of queued and in-progress rows (few but for a
-- backlog), and river_job's primary key.
CREATE FUNCTION txhook_stuck_events(p_river_schema text, p_source text, p_event_key text)
RETURNS TABLE (source text, event_key text, status text, job_id bigint, job_state text, job_error text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    jobs regclass := to_regclass(CASE WHEN coalesce(p_river_schema, '') = '' THEN 'river_job'
                                      ELSE quote_ident(p_river_schema) || '.river_job' END);
BEGIN
    RETURN QUERY
    SELECT e.source, e.event_key, e.status, e.job_id, NULL::text, NULL::text
    FROM txhook_processed_events AS e
    WHERE e.status = 'in_progress' AND e.lease_expires_at <= now() AND e.job_id IS NULL
      AND (p_source IS NULL OR e.source = p_source)
      AND (p_event_key IS NULL OR e.event_key = p_event_key);
    IF jobs IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY EXECUTE format($q$
        SELECT e.source, e.event_key, e.status, e.job_id, coalesce(j.state::text, 'gone'),
               j.errors[array_upper(j.errors, 1)] ->> 'error'
        FROM txhook_processed_events AS e
        LEFT JOIN %s AS j ON j.id = e.job_id
        WHERE (e.status = 'queued' OR (e.status = 'in_progress' AND e.lease_expires_at <= now()))
          AND e.job_id IS NOT NULL
          AND (j.id IS NULL OR j.state::text IN ('completed', 'discarded', 'cancelled'))
          AND ($1::text IS NULL OR e.source = $1)
          AND ($2::text IS NULL OR e.event_key = $2)$q$, jobs)
    USING p_source, p_event_key;
END
$$;
