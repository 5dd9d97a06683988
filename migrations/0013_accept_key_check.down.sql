DROP FUNCTION txhook_raise_key_recorded(text, text);
