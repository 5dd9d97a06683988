-- The transactional mode's dedupe step is a plain INSERT ... ON CONFLICT DO NOTHING since this
-- migration (queries/events.sql's InsertEvent), under the lock_timeout bound the engine sets around
-- it, and a recorded key's claim is read in a statement of its own after the rollback. Measured on
-- PostgreSQL 15 (pgbench, 4 clients, the server's CPU per transaction of BEGIN, the dedupe step and
-- COMMIT): 152-158 microseconds against 163-168 for the function alone, and 174-186 for the function
-- beside the bound that DedupeWithFirstStatement sends anyway. The function stays, unused by txhook
-- from now on, for the processes of an earlier version still running during an upgrade; a later
-- migration drops it.
COMMENT ON FUNCTION txhook_insert_event(text, text, text, bytea, bytea, text) IS
    'txhook''s dedupe step before migration 15; unused since, kept for processes of earlier versions during an upgrade';

-- Inbox mode's accept sends its row's insert the same way: a plain INSERT after a set_config of the
-- bound, with COMMIT (a recorded key fails it with a unique violation of the primary key). The
-- function it called, txhook_queue_event_with_job, stays for the same reason.
COMMENT ON FUNCTION txhook_queue_event_with_job(text, text, text, bytea, bytea, bigint, text) IS
    'txhook''s inbox accept step before migration 15; unused since, kept for processes of earlier versions during an upgrade';
