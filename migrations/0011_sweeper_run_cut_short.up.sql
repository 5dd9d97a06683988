-- Why the sweeper's last run on a hook stopped before it had read the whole window's listing or
-- made every redelivery it found (its page cap reached, a next page link repeating a page already
-- read, its deadline passed); NULL when the run went to the end.
ALTER TABLE txhook_sweeper_runs ADD COLUMN cut_short text;
