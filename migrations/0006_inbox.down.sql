-- Fails while queued rows exist: apply or delete them first.
DROP FUNCTION txhook_queue_event(text, text, text, bytea, bytea, text);
DROP INDEX txhook_processed_events_queued_idx;
ALTER TABLE txhook_processed_events
    DROP COLUMN job_id,
    DROP CONSTRAINT txhook_processed_events_completed_check,
    ADD CONSTRAINT txhook_processed_events_completed_check
        CHECK (status = 'in_progress' OR completed_at IS NOT NULL),
    DROP CONSTRAINT txhook_processed_events_status_check,
    ADD CONSTRAINT txhook_processed_events_status_check
        CHECK (status IN ('in_progress', 'done', 'failed'));
