-- The fenced write of docs/concepts.md, run by fencing_test.go.

-- snippet:table
CREATE TABLE effects (
    key    text   PRIMARY KEY, -- the idempotency key: one effect per key
    token  bigint NOT NULL,    -- the fencing token of the lease that wrote it
    amount bigint NOT NULL
);
-- end snippet

-- snippet:write
INSERT INTO effects AS e (key, token, amount) VALUES ($1, $2, $3)
ON CONFLICT (key) DO UPDATE SET token = excluded.token, amount = excluded.amount
WHERE e.token <= excluded.token
-- end snippet
