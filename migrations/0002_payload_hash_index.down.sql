DROP FUNCTION IF EXISTS txhook_find_replay(text, bytea, text, double precision, text);
DROP INDEX IF EXISTS txhook_processed_events_payload_hash_idx;
