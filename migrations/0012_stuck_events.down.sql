-- Undoes 0012: the stuck events function.
DROP FUNCTION txhook_stuck_events(text, text, text);
