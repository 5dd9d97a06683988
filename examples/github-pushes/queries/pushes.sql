-- name: InsertPush :execrows
-- Records a push delivery; a second insert of the same delivery does nothing.
INSERT INTO pushes (delivery_id, repository, ref, before_sha, after_sha, pusher, commit_count)
VALUES (@delivery_id, @repository, @ref, @before_sha, @after_sha, @pusher, @commit_count)
ON CONFLICT (delivery_id) DO NOTHING;

-- name: CountPush :one
-- Adds a push and its commits to the repository's counters, creating the repository on first
-- sight. Not idempotent: it relies on running once per delivery.
INSERT INTO repositories AS r (full_name, push_count, commit_count, last_ref, last_head_sha)
VALUES (@full_name, 1, @commits::bigint, @ref, @head_sha)
ON CONFLICT (full_name) DO UPDATE
    SET push_count    = r.push_count + 1,
        commit_count  = r.commit_count + EXCLUDED.commit_count,
        last_ref      = EXCLUDED.last_ref,
        last_head_sha = EXCLUDED.last_head_sha,
        updated_at    = now()
RETURNING push_count;

-- name: GetRepository :one
SELECT * FROM repositories WHERE full_name = @full_name;

-- name: ListPushes :many
SELECT * FROM pushes WHERE repository = @repository ORDER BY received_at, delivery_id;
