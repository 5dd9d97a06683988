COMMENT ON FUNCTION txhook_insert_event(text, text, text, bytea, bytea, text) IS NULL;
