{{- /* The idempotency records: a template (see statements.sql). .Table is
the quoted, schema-qualified table name; .Unlogged is UNLOGGED or empty;
.State and .How hold the codes of the state and how columns. Every
statement is idempotent. */ -}}
-- The idempotency middleware's records (backends/pgstore). Idempotent.
CREATE SCHEMA IF NOT EXISTS {{.Schema}};

{{/* snippet:schema */ -}}
CREATE {{.Unlogged}} TABLE IF NOT EXISTS {{.Table}} (
    key              bytea       PRIMARY KEY,
    state            smallint    NOT NULL,           -- {{.State.InProgress}} leased, {{.State.Released}} released, {{.State.Completed}} completed
    owner            text        NOT NULL,
    origin           text,                           -- what acquired the lease (AcquireRequest.Origin)
    token            bigint      NOT NULL,           -- fencing token
    attempt          integer     NOT NULL,
    how              smallint    NOT NULL DEFAULT {{.How.Fresh}}, -- how the lease was taken: {{.How.Fresh}} fresh, {{.How.Takeover}} takeover, {{.How.Reentrant}} re-entrant
    acquired_at      timestamptz,                    -- when the lease was acquired
    lease_expires_at timestamptz NOT NULL,
    retention_us     bigint      NOT NULL,
    completed_at     timestamptz,
    forget_at        timestamptz NOT NULL,           -- absent from then on; completed, from completed_at + retention
    fingerprint      bytea,
    output           bytea,
    waited           boolean     NOT NULL DEFAULT false -- a watch waits for the key: its next change notifies
) WITH (fillfactor = 80);                            -- room on the page for a row's next versions
{{- /* end snippet */}}

-- Tables created by earlier releases get the columns added since; adding
-- a column without a default, or with a constant one, rewrites nothing.
-- Their rows keep no origin or acquisition time (NULL).
ALTER TABLE {{.Table}}
    ADD COLUMN IF NOT EXISTS waited boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS origin text,
    ADD COLUMN IF NOT EXISTS acquired_at timestamptz;

-- Cleanup deletes the oldest forgotten records first.
CREATE INDEX IF NOT EXISTS {{.Index}} ON {{.Table}} (forget_at);

-- Whether a record still counts: its forget_at is to come. Every statement
-- that finds a record by its key asks this of the row it found. The
-- declared cost keeps those statements on the primary key whatever the
-- table's statistics say: a plan that would read more rows than the key's
-- one (a sequential scan, a scan of the forget_at index) would call it on
-- every row it reads, and costs accordingly. Without it, a prepared
-- statement's generic plan made while the table was small and analyzed
-- empty stays a sequential scan as the table grows.
CREATE OR REPLACE FUNCTION {{.Live}}(forget_at timestamptz) RETURNS boolean
    LANGUAGE plpgsql STABLE PARALLEL SAFE COST 10000
    AS $$BEGIN RETURN forget_at > pg_catalog.now(); END$$;
