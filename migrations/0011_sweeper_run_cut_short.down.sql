ALTER TABLE txhook_sweeper_runs DROP COLUMN IF EXISTS cut_short;
