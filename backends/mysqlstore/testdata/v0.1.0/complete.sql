-- mysqlstore 0.1.0's Complete: output, key, owner, token.
UPDATE {{.Table}} SET state = 3, completed_us = {{.Now}}, output = ?, forget_us = {{.Now}} + retention_us
WHERE `key` = ? AND owner = ? AND token = ? AND state = 1 AND forget_us > {{.Now}}
