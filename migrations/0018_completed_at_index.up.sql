-- The pruning index, built anew for events that have a completion time (done or failed):
-- txhook_processed_events_completed_idx (migration 0004, dropped by 0020) held every row not in
-- progress, so inbox mode's accept wrote an entry with a NULL time for each queued row, and its
-- apply wrote the real one. Every query that read the old index bounds completed_at with a
-- comparison, which implies this predicate, so the same plans read this one.
--
-- CONCURRENTLY, so that deliveries go on inserting and updating events while it is built (two
-- scans of the table); PostgreSQL runs it only as the migration's single statement. If it is
-- interrupted, the migration is left dirty with an invalid index of this name: drop the index,
-- then force the version back to 17 and apply again.
CREATE INDEX CONCURRENTLY txhook_processed_events_completed_at_idx
    ON txhook_processed_events (completed_at)
    WHERE completed_at IS NOT NULL;
