-- name: InsertOrder :execrows
-- ON CONFLICT: an order already recorded (a second event about the same checkout
-- session) is not an error; the handler sees 0 rows and adds nothing.
INSERT INTO orders (id, customer_id, amount) VALUES ($1, $2, $3)
ON CONFLICT (id) DO NOTHING;

-- name: AddCustomerSpend :exec
-- Not idempotent on its own: the dedupe in the same transaction makes it run once per event.
INSERT INTO customers (id, total_spent) VALUES (@id, @amount)
ON CONFLICT (id) DO UPDATE SET total_spent = customers.total_spent + excluded.total_spent;

-- name: CountPush :exec
-- Counts a push to the repository: not idempotent on its own either.
INSERT INTO repositories (full_name, pushes) VALUES (@full_name, 1)
ON CONFLICT (full_name) DO UPDATE SET pushes = repositories.pushes + 1;
