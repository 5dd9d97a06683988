DROP FUNCTION txhook_queue_event_with_job(text, text, text, bytea, bytea, bigint, text);
