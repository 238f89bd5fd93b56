{{- /* The acquire function: a template (see statements.sql). .Acquire is
its quoted, schema-qualified name, .Table the table's, .Live the liveness
function's; .State and .How the codes of the state and how columns. The
function's body is what Migrate compares with pg_proc.prosrc to tell
whether the function is this version's. */ -}}
{{- define "acquire args" -}}
(bytea, text, bigint, bigint, bytea, text)
{{- end}}
{{- /* Whether the existing row r can be taken by the inserting owner. */ -}}
{{- define "acquirable" -}}
({{template "until" (.WithRow "r.")}} <= now() OR r.state = {{.State.Released}} OR (r.state = {{.State.InProgress}} AND (r.owner = excluded.owner OR r.lease_expires_at <= now())))
{{- end}}
{{- /* Whether the existing row r is the inserting owner's own live lease. */ -}}
{{- define "reentrant" -}}
(r.forget_at > now() AND r.state = {{.State.InProgress}} AND r.owner = excluded.owner)
{{- end}}
{{- define "insert" -}}
INSERT INTO {{.Table}} AS r
        (key, state, owner, origin, token, attempt, how, acquired_at, lease_expires_at, retention_us, forget_at, fingerprint)
    VALUES ($1, {{.State.InProgress}}, $2, nullif($6, ''), 1, 1, {{.How.Fresh}}, now(), now() + $3 * interval '1 microsecond', $4,
        now() + ($3 + $4) * interval '1 microsecond', $5)
{{- end}}
-- Takes the lease on key $1 for owner $2 (lease TTL $3 µs, retention $4 µs,
-- fingerprint $5, origin $6), or leaves the record as it is, and returns
-- the record. Acquire calls it: one statement, whose plan only runs what
-- the key's record needs, each step with its own snapshot.
CREATE OR REPLACE FUNCTION {{.Acquire}}{{template "acquire args"}}
    RETURNS TABLE (state smallint, owner text, token bigint, attempt integer, how smallint,
        lease_expires_at timestamptz, completed_at timestamptz, fingerprint bytea, output bytea, now timestamptz)
    LANGUAGE plpgsql VOLATILE
    AS $acquire$
#variable_conflict use_column
BEGIN
    -- A fresh key: one insert, nothing else runs.
    RETURN QUERY
    {{template "insert" .}}
    ON CONFLICT (key) DO NOTHING
    RETURNING r.state, r.owner, r.token, r.attempt, r.how, r.lease_expires_at, r.completed_at, r.fingerprint, r.output, now();
    IF FOUND THEN
        RETURN;
    END IF;

    -- A record this call cannot change (completed, or another owner's
    -- live lease, with a fingerprint or none asked to be adopted) is only
    -- read: a duplicate writes nothing, so its transaction needs no WAL
    -- flush and leaves no dead row behind. The read is of its own
    -- snapshot, a state the record held when it began.
    RETURN QUERY
    SELECT r.state, r.owner, r.token, r.attempt, r.how, r.lease_expires_at, r.completed_at, r.fingerprint, r.output, now()
    FROM {{.Table}} AS r
    WHERE r.key = $1 AND {{.Live}}({{template "until" (.WithRow "r.")}})
      AND (r.state = {{.State.Completed}} OR (r.state = {{.State.InProgress}} AND r.owner <> $2 AND r.lease_expires_at > now()))
      AND (r.fingerprint IS NOT NULL OR $5 IS NULL);
    IF FOUND THEN
        RETURN;
    END IF;

    -- Anything else (a released record, a lease run out or the owner's
    -- own, a record past its retention, a fingerprint to adopt, or a
    -- record that changed since the read): the upsert. The conflicting
    -- row is locked and always returned, so concurrent callers are
    -- serialised on it and each sees the row as the winner left it; a
    -- row the call cannot take is returned as it is. A record without a
    -- fingerprint adopts the first one given. A new lease gets this
    -- call's origin and time; the owner's own keeps those it had.
    RETURN QUERY
    {{template "insert" .}}
    ON CONFLICT (key) DO UPDATE SET
        state            = CASE WHEN {{template "acquirable" .}} THEN {{.State.InProgress}} ELSE r.state END,
        how              = CASE WHEN NOT ({{template "acquirable" .}}) THEN r.how
                                WHEN {{template "reentrant" .}} THEN {{.How.Reentrant}}
                                WHEN r.forget_at > now() AND r.state = {{.State.InProgress}} THEN {{.How.Takeover}}
                                ELSE {{.How.Fresh}} END,
        token            = CASE WHEN NOT ({{template "acquirable" .}}) OR {{template "reentrant" .}} THEN r.token ELSE r.token + 1 END,
        attempt          = CASE WHEN NOT ({{template "acquirable" .}}) OR {{template "reentrant" .}} THEN r.attempt
                                WHEN {{template "until" (.WithRow "r.")}} <= now() THEN 1
                                ELSE r.attempt + 1 END,
        origin           = CASE WHEN NOT ({{template "acquirable" .}}) OR {{template "reentrant" .}} THEN r.origin ELSE excluded.origin END,
        acquired_at      = CASE WHEN NOT ({{template "acquirable" .}}) OR {{template "reentrant" .}} THEN r.acquired_at ELSE excluded.acquired_at END,
        owner            = CASE WHEN {{template "acquirable" .}} THEN excluded.owner ELSE r.owner END,
        lease_expires_at = CASE WHEN {{template "acquirable" .}} THEN excluded.lease_expires_at ELSE r.lease_expires_at END,
        retention_us     = CASE WHEN {{template "acquirable" .}} THEN excluded.retention_us ELSE r.retention_us END,
        forget_at        = CASE WHEN {{template "acquirable" .}} THEN excluded.forget_at ELSE r.forget_at END,
        fingerprint      = CASE WHEN {{template "until" (.WithRow "r.")}} <= now() THEN excluded.fingerprint
                                ELSE coalesce(r.fingerprint, excluded.fingerprint) END,
        completed_at     = CASE WHEN {{template "until" (.WithRow "r.")}} <= now() THEN NULL ELSE r.completed_at END,
        output           = CASE WHEN {{template "until" (.WithRow "r.")}} <= now() THEN NULL ELSE r.output END
    RETURNING r.state, r.owner, r.token, r.attempt, r.how, r.lease_expires_at, r.completed_at, r.fingerprint, r.output, now();
END
$acquire$;

