-- The idempotency middleware's records (backends/mysqlstore). Idempotent.
-- Times are Unix microseconds by the server's clock, in UTC whatever the
-- session's time zone. Keys and owners are bytes: no collation folds
-- 'order-A' into 'ORDER-a'.
{{/* snippet:schema */ -}}
CREATE TABLE IF NOT EXISTS {{.Table}} (
    `key`            VARBINARY(2048) NOT NULL,
    state            TINYINT         NOT NULL,           -- {{.State.InProgress}} leased, {{.State.Released}} released, {{.State.Completed}} completed
    owner            VARBINARY(255)  NOT NULL,
    origin           VARBINARY(255)  NULL,               -- what acquired the lease (AcquireRequest.Origin)
    token            BIGINT          NOT NULL,           -- fencing token
    attempt          INT             NOT NULL,
    how              TINYINT         NOT NULL DEFAULT {{.How.Fresh}}, -- how the lease was last taken (see acquire.sql)
    acquired_us      BIGINT          NULL,               -- when the lease was acquired
    lease_expires_us BIGINT          NOT NULL,
    retention_us     BIGINT          NOT NULL,
    completed_us     BIGINT          NULL,               -- 0 (NULL in older rows) until completed
    forget_us        BIGINT          NOT NULL,           -- absent from then on; completed, from completed_us + retention
    fingerprint      BLOB            NULL,
    output           LONGBLOB        NULL,
    PRIMARY KEY (`key`),
    INDEX {{.Index}} (forget_us)                         -- cleanup deletes the oldest forgotten first
) ENGINE = InnoDB
{{- /* end snippet */}}
