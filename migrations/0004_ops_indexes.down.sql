DROP INDEX IF EXISTS txhook_processed_events_open_idx;
DROP INDEX IF EXISTS txhook_processed_events_completed_idx;
