CREATE INDEX CONCURRENTLY IF NOT EXISTS txhook_processed_events_open_idx
    ON txhook_processed_events (status, created_at)
    WHERE status IN ('failed', 'in_progress');
