-- The stripe-orders example's business tables. Amounts are integer cents, as Stripe sends them.

-- One row per completed Checkout Session. customer_id is NULL for a guest checkout (Stripe sends
-- "customer": null when no Customer object was created).
CREATE TABLE orders (
    checkout_session_id text        PRIMARY KEY,
    customer_id         text,
    amount_total        bigint      NOT NULL CHECK (amount_total >= 0),
    created_at          timestamptz NOT NULL DEFAULT now()
);

-- A running total per customer. Adding to it is not idempotent on its own: applying the same
-- checkout.session.completed twice counts the money twice. txhook's dedupe, committed in the same
-- transaction, is what keeps it right.
CREATE TABLE customers (
    id          text        PRIMARY KEY,
    total_spent bigint      NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Invoices move from pending to paid, never back. Both writes are idempotent on their own
-- (defence in depth): created inserts or does nothing, paid is a conditional transition.
CREATE TABLE invoices (
    id          text        PRIMARY KEY,
    customer_id text        NOT NULL,
    amount_due  bigint      NOT NULL CHECK (amount_due >= 0),
    status      text        NOT NULL CHECK (status IN ('pending', 'paid')),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- One shipment per succeeded PaymentIntent, written after the fulfillment service accepted it.
CREATE TABLE shipments (
    payment_intent_id text        PRIMARY KEY,
    amount            bigint      NOT NULL CHECK (amount >= 0),
    -- The Idempotency-Key sent to the fulfillment service.
    idempotency_key   text        NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now()
);
