DROP TABLE IF EXISTS txhook_sweeper_runs;
DROP TABLE IF EXISTS txhook_redeliveries;
