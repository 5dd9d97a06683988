-- The github-pushes example's tables.

-- One row per push delivery: X-GitHub-Delivery identifies the delivery and stays the same when
-- GitHub (or an operator) redelivers it.
CREATE TABLE pushes (
    delivery_id  text        PRIMARY KEY,
    repository   text        NOT NULL,
    ref          text        NOT NULL,
    before_sha   text        NOT NULL,
    after_sha    text        NOT NULL,
    pusher       text        NOT NULL,
    commit_count integer     NOT NULL CHECK (commit_count >= 0),
    received_at  timestamptz NOT NULL DEFAULT now()
);

-- Running counters per repository. Adding to them is not idempotent on its own: the dedupe,
-- committed in the same transaction, keeps them right.
CREATE TABLE repositories (
    full_name     text        PRIMARY KEY,
    push_count    bigint      NOT NULL DEFAULT 0,
    commit_count  bigint      NOT NULL DEFAULT 0,
    last_ref      text        NOT NULL,
    last_head_sha text        NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now()
);
