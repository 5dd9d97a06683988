-- The pruner's latest run, for operators (the console's overview): a single row, rewritten by
-- every batch of a run that holds the pruning lock, in that batch's transaction.
CREATE TABLE txhook_prune_runs (
    id             boolean     PRIMARY KEY DEFAULT true CHECK (id),
    started_at     timestamptz NOT NULL,
    last_batch_at  timestamptz NOT NULL,
    cutoff         timestamptz NOT NULL,
    include_failed boolean     NOT NULL,
    deleted        bigint      NOT NULL,
    batches        integer     NOT NULL
);
