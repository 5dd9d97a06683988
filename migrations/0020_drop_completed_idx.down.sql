CREATE INDEX CONCURRENTLY IF NOT EXISTS txhook_processed_events_completed_idx
    ON txhook_processed_events (completed_at)
    WHERE status <> 'in_progress';
