-- A validated constraint stays validated: 0016's down migration removes it.
SELECT 1;
