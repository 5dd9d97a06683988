-- The GitHub redelivery sweeper's memory (package ghsweep).

-- One row per delivery guid the sweeper asked GitHub to redeliver, per source (the endpoint's
-- source name, the same as in txhook_processed_events). A row keeps the guid from being asked
-- again until GitHub has made a newer attempt at it (a delivery id above last_delivery_id) or,
-- when no newer attempt shows up, until the sweeper's resend interval has passed since
-- requested_at. status: 'requesting' while the request is being sent (left so by a sweeper
-- that died meanwhile, with an unknown outcome: asked again after a short grace), 'requested'
-- once GitHub accepted it, 'failed' when GitHub refused it (the next run may ask again).
CREATE TABLE txhook_redeliveries (
    source           text        NOT NULL,
    guid             text        NOT NULL,
    -- The hook the guid was listed under, as the sweeper names it (repos/o/r/hooks/1, ...).
    hook             text        NOT NULL,
    event            text        NOT NULL DEFAULT '',
    -- The newest delivery id of the guid when the redelivery was requested.
    last_delivery_id bigint      NOT NULL,
    status           text        NOT NULL,
    requests         integer     NOT NULL DEFAULT 1,
    first_failed_at  timestamptz NOT NULL,
    requested_at     timestamptz NOT NULL DEFAULT now(),
    last_error       text,
    PRIMARY KEY (source, guid),
    CONSTRAINT txhook_redeliveries_status_check CHECK (status IN ('requesting', 'requested', 'failed'))
);

-- Newest first, for listing what the sweeper redelivered, and for pruning.
CREATE INDEX txhook_redeliveries_requested_idx ON txhook_redeliveries (requested_at);

-- One row per swept hook: when the sweeper last ran and what it found.
CREATE TABLE txhook_sweeper_runs (
    source           text        NOT NULL,
    hook             text        NOT NULL,
    started_at       timestamptz NOT NULL,
    finished_at      timestamptz NOT NULL,
    -- The newest delivery id the run listed; the next run counts the deliveries above it as new.
    cursor_delivery_id bigint    NOT NULL DEFAULT 0,
    deliveries       integer     NOT NULL DEFAULT 0,
    failed           integer     NOT NULL DEFAULT 0,
    settled          integer     NOT NULL DEFAULT 0,
    redelivered      integer     NOT NULL DEFAULT 0,
    total_redelivered bigint     NOT NULL DEFAULT 0,
    last_error       text,
    PRIMARY KEY (source, hook)
);
