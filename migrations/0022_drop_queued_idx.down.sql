CREATE INDEX CONCURRENTLY IF NOT EXISTS txhook_processed_events_queued_idx
    ON txhook_processed_events (created_at)
    WHERE status = 'queued';
