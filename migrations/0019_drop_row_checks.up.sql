-- The events table's four CHECK constraints (status, attempts, lease, completed_at) cost more than
-- anything else the dedupe step does: PostgreSQL reads each constraint's expression from its
-- stored text and plans it again for every INSERT and UPDATE statement, however few rows it
-- writes. Measured on PostgreSQL 15 (a backend's instructions counted under callgrind), the
-- stripe-orders example's event took about 597,000 instructions with them and 482,000 without:
-- a fifth of the database's work per event. Every write to the table is txhook's own (its migrations' functions
-- and its queries), each of which sets status together with what the constraints tied to it
-- (lease_expires_at for in_progress, completed_at for done and failed), so they are dropped.
-- Dropping a constraint takes a brief exclusive lock and neither scans nor rewrites the table.
ALTER TABLE txhook_processed_events
    DROP CONSTRAINT txhook_processed_events_status_check,
    DROP CONSTRAINT txhook_processed_events_attempts_check,
    DROP CONSTRAINT txhook_processed_events_lease_check,
    DROP CONSTRAINT txhook_processed_events_completed_check;
