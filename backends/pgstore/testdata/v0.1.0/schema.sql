{{- /* The idempotency records: a template. .Table is the quoted,
schema-qualified table name; .Unlogged is UNLOGGED or empty. Every
statement is idempotent. */ -}}
-- The idempotency middleware's records (backends/pgstore). Idempotent.
CREATE SCHEMA IF NOT EXISTS {{.Schema}};

{{/* snippet:schema */ -}}
CREATE {{.Unlogged}} TABLE IF NOT EXISTS {{.Table}} (
    key              bytea       PRIMARY KEY,
    state            smallint    NOT NULL,           -- 1 in progress, 2 released, 3 completed
    owner            text        NOT NULL,
    token            bigint      NOT NULL,           -- fencing token
    attempt          integer     NOT NULL,
    how              smallint    NOT NULL DEFAULT 0, -- how the lease was taken: 0 fresh, 1 takeover, 2 re-entrant
    lease_expires_at timestamptz NOT NULL,
    retention_us     bigint      NOT NULL,
    completed_at     timestamptz,
    forget_at        timestamptz NOT NULL,           -- the record counts as absent from then on
    fingerprint      bytea,
    output           bytea,
    waited           boolean     NOT NULL DEFAULT false -- a watch waits for the key: its next change notifies
) WITH (fillfactor = 80);                            -- room for HOT updates of lease renewals
{{- /* end snippet */}}

-- Tables created before the waited column get it; adding a column with a
-- constant default rewrites nothing.
ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS waited boolean NOT NULL DEFAULT false;

-- Cleanup deletes the oldest forgotten records first.
CREATE INDEX IF NOT EXISTS {{.Index}} ON {{.Table}} (forget_at);
