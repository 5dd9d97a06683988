ALTER TABLE txhook_processed_events
    ADD CONSTRAINT txhook_processed_events_status_check
        CHECK (status IN ('queued', 'in_progress', 'done', 'failed')),
    ADD CONSTRAINT txhook_processed_events_attempts_check CHECK (attempts > 0),
    ADD CONSTRAINT txhook_processed_events_lease_check
        CHECK (status <> 'in_progress' OR lease_expires_at IS NOT NULL),
    ADD CONSTRAINT txhook_processed_events_completed_check
        CHECK (status IN ('queued', 'in_progress') OR completed_at IS NOT NULL),
    DROP CONSTRAINT txhook_processed_events_row_check;
DROP FUNCTION txhook_event_row_valid(text, integer, timestamptz, timestamptz);
