-- Validates the constraint 0016 added NOT VALID: a scan of the events table under a SHARE UPDATE
-- EXCLUSIVE lock, which lets deliveries insert and update rows meanwhile (in a migration of its
-- own, since 0016's statements held a lock that does not). Every row passes: the constraints 0016
-- replaced held for them.
ALTER TABLE txhook_processed_events VALIDATE CONSTRAINT txhook_processed_events_row_check;
