-- The application's own tables (txhook's come from its migrations package).
CREATE TABLE customers (
    id          text   PRIMARY KEY,
    total_spent bigint NOT NULL DEFAULT 0
);
CREATE TABLE orders (
    id          text   PRIMARY KEY, -- Stripe's checkout session id
    customer_id text   NOT NULL,
    amount      bigint NOT NULL
);
CREATE TABLE repositories (
    full_name text   PRIMARY KEY, -- GitHub's owner/name
    pushes    bigint NOT NULL DEFAULT 0
);
