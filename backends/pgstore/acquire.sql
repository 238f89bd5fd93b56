{{- /* The acquire function: a template. .Acquire is its quoted,
schema-qualified name, .Table the table's, .Live the liveness function's;
.Acquirable and .Reentrant are the conditions on the existing row r, .Until
the time until which r counts (untilSQL). */ -}}
{{- define "insert" -}}
INSERT INTO {{.Table}} AS r
        (key, state, owner, origin, token, attempt, how, acquired_at, lease_expires_at, retention_us, forget_at, fingerprint)
    VALUES ($1, 1, $2, nullif($6, ''), 1, 1, 0, now(), now() + $3 * interval '1 microsecond', $4,
        now() + ($3 + $4) * interval '1 microsecond', $5)
{{- end}}
-- Takes the lease on key $1 for owner $2 (lease TTL $3 µs, retention $4 µs,
-- fingerprint $5, origin $6), or leaves the record as it is, and returns
-- the record. Acquire calls it: one statement, whose plan only runs what
-- the key's record needs, each step with its own snapshot.
CREATE OR REPLACE FUNCTION {{.Acquire}}(bytea, text, bigint, bigint, bytea, text)
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
    WHERE r.key = $1 AND {{.Live}}({{.Until}})
      AND (r.state = 3 OR (r.state = 1 AND r.owner <> $2 AND r.lease_expires_at > now()))
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
        state            = CASE WHEN {{.Acquirable}} THEN 1 ELSE r.state END,
        how              = CASE WHEN NOT ({{.Acquirable}}) THEN r.how
                                WHEN {{.Reentrant}} THEN 2
                                WHEN r.forget_at > now() AND r.state = 1 THEN 1
                                ELSE 0 END,
        token            = CASE WHEN NOT ({{.Acquirable}}) OR {{.Reentrant}} THEN r.token ELSE r.token + 1 END,
        attempt          = CASE WHEN NOT ({{.Acquirable}}) OR {{.Reentrant}} THEN r.attempt
                                WHEN {{.Until}} <= now() THEN 1
                                ELSE r.attempt + 1 END,
        origin           = CASE WHEN NOT ({{.Acquirable}}) OR {{.Reentrant}} THEN r.origin ELSE excluded.origin END,
        acquired_at      = CASE WHEN NOT ({{.Acquirable}}) OR {{.Reentrant}} THEN r.acquired_at ELSE excluded.acquired_at END,
        owner            = CASE WHEN {{.Acquirable}} THEN excluded.owner ELSE r.owner END,
        lease_expires_at = CASE WHEN {{.Acquirable}} THEN excluded.lease_expires_at ELSE r.lease_expires_at END,
        retention_us     = CASE WHEN {{.Acquirable}} THEN excluded.retention_us ELSE r.retention_us END,
        forget_at        = CASE WHEN {{.Acquirable}} THEN excluded.forget_at ELSE r.forget_at END,
        fingerprint      = CASE WHEN {{.Until}} <= now() THEN excluded.fingerprint
                                ELSE coalesce(r.fingerprint, excluded.fingerprint) END,
        completed_at     = CASE WHEN {{.Until}} <= now() THEN NULL ELSE r.completed_at END,
        output           = CASE WHEN {{.Until}} <= now() THEN NULL ELSE r.output END
    RETURNING r.state, r.owner, r.token, r.attempt, r.how, r.lease_expires_at, r.completed_at, r.fingerprint, r.output, now();
END
$acquire$;

