COMMENT ON FUNCTION txhook_insert_event(text, text, text, bytea, bytea, text) IS NULL;
COMMENT ON FUNCTION txhook_queue_event_with_job(text, text, text, bytea, bytea, bigint, text) IS NULL;
