DROP TABLE IF EXISTS txhook_prune_runs;
