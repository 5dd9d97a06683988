DROP FUNCTION IF EXISTS txhook_insert_event(text, text, text, bytea, bytea, text);
DROP TABLE IF EXISTS txhook_processed_events;
