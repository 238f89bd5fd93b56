-- Takes the lease on key ? for owner ? or leaves the record as it is, in
-- one statement; the conflicting row is locked, so concurrent callers are
-- serialised on it. Assignments in ON DUPLICATE KEY UPDATE run left to
-- right and each sees the new values of those before it, so `how` is
-- decided first, from the old row, and every later assignment reads only
-- `how` and its own column's old value. `how` is what this Acquire did:
--   0 a new record (or one past its retention), 1 a takeover of an
--   expired lease, 2 the owner's own lease again, 3 after a release,
--   4 nothing: held by another owner, or completed.
-- The parameters are bound again in the update instead of VALUES(), which
-- MySQL 8.0.20+ deprecates and whose replacement MariaDB lacks.
INSERT INTO {{.Table}}
    (`key`, state, owner, token, attempt, how, lease_expires_us, retention_us, forget_us, fingerprint)
VALUES
    (:key, 1, :owner, 1, 1, 0, {{.Now}} + :ttl, :ret, {{.Now}} + :ttl + :ret, :fp)
ON DUPLICATE KEY UPDATE
    how              = CASE WHEN forget_us <= {{.Now}} THEN 0
                            WHEN state = 2 THEN 3
                            WHEN state = 1 AND owner = :owner THEN 2
                            WHEN state = 1 AND lease_expires_us <= {{.Now}} THEN 1
                            ELSE 4 END,
    token            = IF(how IN (0, 1, 3), token + 1, token),
    attempt          = CASE how WHEN 0 THEN 1 WHEN 1 THEN attempt + 1 WHEN 3 THEN attempt + 1 ELSE attempt END,
    fingerprint      = IF(how = 0, :fp, COALESCE(fingerprint, :fp)),
    completed_us     = IF(how = 0, NULL, completed_us),
    output           = IF(how = 0, NULL, output),
    retention_us     = IF(how = 4, retention_us, :ret),
    lease_expires_us = IF(how = 4, lease_expires_us, {{.Now}} + :ttl),
    forget_us        = IF(how = 4, forget_us, {{.Now}} + :ttl + :ret),
    owner            = IF(how = 4, owner, :owner),
    state            = IF(how = 4, state, 1)
