-- The constraints come back NOT VALID: enforced on every row written from now on, without a scan of
-- the table under its lock (the rows txhook wrote meanwhile satisfy them). VALIDATE CONSTRAINT
-- checks the existing rows later, without blocking writes.
ALTER TABLE txhook_processed_events
    ADD CONSTRAINT txhook_processed_events_status_check
        CHECK (status IN ('queued', 'in_progress', 'done', 'failed')) NOT VALID,
    ADD CONSTRAINT txhook_processed_events_attempts_check CHECK (attempts > 0) NOT VALID,
    ADD CONSTRAINT txhook_processed_events_lease_check
        CHECK (status <> 'in_progress' OR lease_expires_at IS NOT NULL) NOT VALID,
    ADD CONSTRAINT txhook_processed_events_completed_check
        CHECK (status IN ('queued', 'in_progress') OR completed_at IS NOT NULL) NOT VALID;
