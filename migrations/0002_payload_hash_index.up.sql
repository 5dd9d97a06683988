-- Index for the HTTP handler's replay guard: looks up a source's events by the hash of their
-- signed body. Partial, so rows without a hash (providers whose ids are signed) cost nothing.
CREATE INDEX txhook_processed_events_payload_hash_idx
    ON txhook_processed_events (source, payload_hash)
    WHERE payload_hash IS NOT NULL;
