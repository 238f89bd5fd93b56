-- pgstore 0.1.0's Complete (without the notification of watchers, which
-- these tests do not use): $1 key, $2 owner, $3 token, $4 output.
UPDATE {{.Table}} SET state = 3, completed_at = now(), output = $4,
    forget_at = now() + retention_us * interval '1 microsecond'
WHERE key = $1 AND owner = $2 AND token = $3 AND state = 1 AND forget_at > now()
