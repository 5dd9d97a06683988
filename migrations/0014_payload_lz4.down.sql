ALTER TABLE txhook_processed_events ALTER COLUMN payload SET COMPRESSION default;
