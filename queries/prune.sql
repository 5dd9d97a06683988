-- name: RecordPruneBatch :exec
-- Records a committed batch of the current prune run in txhook_prune_runs, in the batch's
-- transaction. The run's first batch starts a new record; later ones add to it.
INSERT INTO txhook_prune_runs AS r (id, started_at, last_batch_at, cutoff, include_failed, deleted, batches)
VALUES (true, @started_at::timestamptz, now(), @cutoff::timestamptz, @include_failed::boolean, @deleted::bigint, 1)
ON CONFLICT (id) DO UPDATE
    SET last_batch_at = now(),
        cutoff = excluded.cutoff,
        include_failed = excluded.include_failed,
        deleted = CASE WHEN r.started_at = excluded.started_at THEN r.deleted + excluded.deleted ELSE excluded.deleted END,
        batches = CASE WHEN r.started_at = excluded.started_at THEN r.batches + 1 ELSE 1 END,
        started_at = excluded.started_at;

-- name: LastPruneRun :many
-- The pruner's latest run, if any.
SELECT started_at, last_batch_at, cutoff, include_failed, deleted, batches
FROM txhook_prune_runs;
