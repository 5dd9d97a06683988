DROP FUNCTION IF EXISTS txhook_check_replay(text, bytea, text, double precision, text);
