-- One index for the events that are not done (queued, in progress or failed), by status and
-- creation time, in place of two: txhook_processed_events_open_idx (failed and in progress, 0004)
-- and txhook_processed_events_queued_idx (queued, 0006), both dropped by 0021 and 0022. PostgreSQL
-- opens every index of a table and prepares each partial index's predicate for every statement
-- that writes the table, so each index costs every insert and update, not only those it holds;
-- one fewer, with the 0018 index, cut the server's instructions for a done event's insert by
-- ~6% (callgrind, PostgreSQL 15: 205k to 193k for BEGIN, the insert and COMMIT). Its queries
-- name one status or a list of statuses, which implies this predicate.
--
-- CONCURRENTLY, as 0018 (and with the same remedy if it is interrupted, the version to force
-- being 18).
CREATE INDEX CONCURRENTLY txhook_processed_events_not_done_idx
    ON txhook_processed_events (status, created_at)
    WHERE status <> 'done';
