-- name: InsertOrder :execrows
-- Records a completed Checkout Session; a second insert of the same session does nothing.
INSERT INTO orders (checkout_session_id, customer_id, amount_total)
VALUES (@checkout_session_id, @customer_id, @amount_total)
ON CONFLICT (checkout_session_id) DO NOTHING;

-- name: AddCustomerSpend :exec
-- Adds amount to the customer's total, creating the customer on first sight. Not idempotent:
-- it relies on running once per event, which the dedupe in the same transaction guarantees.
INSERT INTO customers AS c (id, total_spent)
VALUES (@id, @amount::bigint)
ON CONFLICT (id) DO UPDATE
    SET total_spent = c.total_spent + EXCLUDED.total_spent, updated_at = now();

-- name: CreateInvoice :execrows
-- Records a new invoice as pending. Does nothing when the invoice exists, including when
-- invoice.paid arrived first and recorded it as paid.
INSERT INTO invoices (id, customer_id, amount_due, status)
VALUES (@id, @customer_id, @amount_due, 'pending')
ON CONFLICT (id) DO NOTHING;

-- name: MarkInvoicePaid :execrows
-- The conditional transition pending -> paid, in one statement that also covers an
-- invoice.paid arriving before invoice.created (it records the invoice as paid). Returns 0
-- when the invoice was already paid. One statement rather than UPDATE-then-INSERT, so that an
-- invoice.created committed between the two cannot leave a paid invoice pending.
INSERT INTO invoices AS i (id, customer_id, amount_due, status)
VALUES (@id, @customer_id, @amount_due, 'paid')
ON CONFLICT (id) DO UPDATE
    SET status = 'paid', updated_at = now()
    WHERE i.status = 'pending';

-- name: InsertShipment :execrows
-- Records the shipment of a PaymentIntent; a second insert for the same intent does nothing.
INSERT INTO shipments (payment_intent_id, amount, idempotency_key)
VALUES (@payment_intent_id, @amount, @idempotency_key)
ON CONFLICT (payment_intent_id) DO NOTHING;

-- name: GetCustomer :one
SELECT * FROM customers WHERE id = @id;

-- name: GetOrder :one
SELECT * FROM orders WHERE checkout_session_id = @checkout_session_id;

-- name: GetInvoice :one
SELECT * FROM invoices WHERE id = @id;

-- name: GetShipment :one
SELECT * FROM shipments WHERE payment_intent_id = @payment_intent_id;
