-- 0018's index replaces this one. CONCURRENTLY: deliveries are not blocked while it is dropped.
DROP INDEX CONCURRENTLY IF EXISTS txhook_processed_events_completed_idx;
