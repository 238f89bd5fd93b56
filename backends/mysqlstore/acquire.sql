{{- /* When the Acquire changes nothing (the key is held by another owner,
or completed), `how` holds its old value plus 8 while the later
assignments keep their columns, and the last assignment puts it back: the
row ends as it was, so the server writes nothing, and a duplicate only
locks and reads the row (a fingerprint to adopt is the one change it
makes). Kept out of the SQL sent: the server shows a statement's first
1,024 characters in INNODB_TRX. */ -}}
-- Takes the lease on key ? for owner ? or leaves the record as it is, in
-- one statement; the conflicting row is locked, so concurrent callers are
-- serialised on it. Assignments in ON DUPLICATE KEY UPDATE run left to
-- right and each sees the new values of those before it, so `how` is
-- decided first, from the old row, and every later assignment reads only
-- `how` and its own column's old value. `how` is what this Acquire did:
--   0 a new record (or one past its retention), 1 a takeover of an
--   expired lease, 2 the owner's own lease again, 3 after a release;
--   old + 8 until the last assignment: nothing, the row ends as it was.
-- A new lease (0, 1, 3) gets this call's origin and time; the owner's own
-- keeps those it had.
-- The parameters are bound again in the update instead of VALUES(), which
-- MySQL 8.0.20+ deprecates and whose replacement MariaDB lacks.
INSERT INTO {{.Table}}
    (`key`, state, owner, origin, token, attempt, how, acquired_us, lease_expires_us, retention_us, forget_us, fingerprint)
VALUES
    (:key, 1, :owner, :origin, 1, 1, 0, {{.Now}}, {{.Now}} + :ttl, :ret, {{.Now}} + :ttl + :ret, :fp)
ON DUPLICATE KEY UPDATE
    how              = CASE WHEN {{.Until}} <= {{.Now}} THEN 0
                            WHEN state = 2 THEN 3
                            WHEN state = 1 AND owner = :owner THEN 2
                            WHEN state = 1 AND lease_expires_us <= {{.Now}} THEN 1
                            ELSE how + 8 END,
    token            = IF(how IN (0, 1, 3), token + 1, token),
    attempt          = CASE how WHEN 0 THEN 1 WHEN 1 THEN attempt + 1 WHEN 3 THEN attempt + 1 ELSE attempt END,
    origin           = IF(how IN (0, 1, 3), :origin, origin),
    acquired_us      = IF(how IN (0, 1, 3), {{.Now}}, acquired_us),
    fingerprint      = IF(how = 0, :fp, COALESCE(fingerprint, :fp)),
    completed_us     = IF(how = 0, NULL, completed_us),
    output           = IF(how = 0, NULL, output),
    retention_us     = IF(how >= 8, retention_us, :ret),
    lease_expires_us = IF(how >= 8, lease_expires_us, {{.Now}} + :ttl),
    forget_us        = IF(how >= 8, forget_us, {{.Now}} + :ttl + :ret),
    owner            = IF(how >= 8, owner, :owner),
    state            = IF(how >= 8, state, 1),
    how              = IF(how >= 8, how - 8, how)
