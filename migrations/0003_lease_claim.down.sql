DROP FUNCTION IF EXISTS txhook_claim_event(text, text, text, bytea, bytea, bigint, boolean, text);
