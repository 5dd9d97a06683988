-- Indexes for operating the events table (pruning, dead letters, stats).

-- Pruning deletes done (and optionally failed) rows by completed_at in bounded batches; each
-- batch finds its rows through this index instead of scanning the table. In-progress rows are
-- never pruned and stay out of it.
CREATE INDEX txhook_processed_events_completed_idx
    ON txhook_processed_events (completed_at)
    WHERE status <> 'in_progress';

-- Failed (dead-letter) and in-progress rows, newest first, for listing them and for stats,
-- without reading the done rows that make up almost all of the table. Small: it holds only
-- rows that are not done.
CREATE INDEX txhook_processed_events_open_idx
    ON txhook_processed_events (status, created_at)
    WHERE status IN ('failed', 'in_progress');
