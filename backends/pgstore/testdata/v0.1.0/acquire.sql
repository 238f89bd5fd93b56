-- Takes the lease on $1 for owner $2 (lease TTL $3 µs, retention $4 µs,
-- fingerprint $5), or leaves the record as it is. One statement.
--
-- A record that this call cannot change (completed, or another owner's
-- live lease, with a fingerprint or none asked to be adopted) is only
-- read: a duplicate writes nothing, so its transaction needs no WAL flush
-- and leaves no dead row behind. The read is of the statement's snapshot,
-- a state the record held when the statement began.
--
-- Otherwise the upsert runs: the conflicting row is locked and always
-- returned, so concurrent callers are serialised on it and each sees the
-- row as the winner left it. A record without a fingerprint adopts the
-- first one given.
WITH kept AS (
    SELECT state, owner, token, attempt, how, lease_expires_at, completed_at, fingerprint, output, now() AS now
    FROM {{.Table}} AS r
    WHERE key = $1 AND r.forget_at > now()
      AND (r.state = 3 OR (r.state = 1 AND r.owner <> $2::text AND r.lease_expires_at > now()))
      AND (r.fingerprint IS NOT NULL OR $5::bytea IS NULL)
), taken AS (
    INSERT INTO {{.Table}} AS r
        (key, state, owner, token, attempt, how, lease_expires_at, retention_us, forget_at, fingerprint)
    SELECT $1, 1, $2::text, 1, 1, 0, now() + $3::bigint * interval '1 microsecond', $4::bigint,
        now() + ($3::bigint + $4::bigint) * interval '1 microsecond', $5::bytea
    WHERE NOT EXISTS (SELECT FROM kept)
    ON CONFLICT (key) DO UPDATE SET
        state            = CASE WHEN {{.Acquirable}} THEN 1 ELSE r.state END,
        how              = CASE WHEN NOT ({{.Acquirable}}) THEN r.how
                                WHEN {{.Reentrant}} THEN 2
                                WHEN r.forget_at > now() AND r.state = 1 THEN 1
                                ELSE 0 END,
        token            = CASE WHEN NOT ({{.Acquirable}}) OR {{.Reentrant}} THEN r.token ELSE r.token + 1 END,
        attempt          = CASE WHEN NOT ({{.Acquirable}}) OR {{.Reentrant}} THEN r.attempt
                                WHEN r.forget_at <= now() THEN 1
                                ELSE r.attempt + 1 END,
        owner            = CASE WHEN {{.Acquirable}} THEN excluded.owner ELSE r.owner END,
        lease_expires_at = CASE WHEN {{.Acquirable}} THEN excluded.lease_expires_at ELSE r.lease_expires_at END,
        retention_us     = CASE WHEN {{.Acquirable}} THEN excluded.retention_us ELSE r.retention_us END,
        forget_at        = CASE WHEN {{.Acquirable}} THEN excluded.forget_at ELSE r.forget_at END,
        fingerprint      = CASE WHEN r.forget_at <= now() THEN excluded.fingerprint
                                ELSE coalesce(r.fingerprint, excluded.fingerprint) END,
        completed_at     = CASE WHEN r.forget_at <= now() THEN NULL ELSE r.completed_at END,
        output           = CASE WHEN r.forget_at <= now() THEN NULL ELSE r.output END
    RETURNING state, owner, token, attempt, how, lease_expires_at, completed_at, fingerprint, output, now()
)
SELECT * FROM kept UNION ALL SELECT * FROM taken
