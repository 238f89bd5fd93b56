{{- /* The store's statements, but for the schema (schema.sql) and
Acquire's upsert (acquire.sql). New renders each once, with sqlData:
{{arg "name"}} is a parameter, rendered as ? with its name recorded, and
a call binds the value of that name there (params in mysqlstore.go). The
state and how codes come from the Go constants, and are never written
here as numbers. Comments in template comments stay out of the SQL sent. */ -}}

{{- /* The server's clock in Unix microseconds: UTC_TIMESTAMP is fixed
for the statement and, unlike NOW(), does not depend on the session's
time zone. */ -}}
{{define "now" -}}
TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))
{{- end}}

{{- /* The time until which a record counts: for a completed record, its
completion plus its retention; for any other, forget_us. A completion
within its lease leaves forget_us as Acquire set it, the lease's end plus
the retention (see "complete"), so that the update changes no indexed
column and InnoDB leaves the forget_us index alone; forget_us is then
only a bound, and cleanup, which reads its index, deletes a completed
record once both times have passed. */ -}}
{{define "until" -}}
IF(state = {{.State.Completed}}, completed_us + retention_us, forget_us)
{{- end}}

{{- /* The lease's own live record. */ -}}
{{define "held" -}}
`key` = {{arg "key"}} AND owner = {{arg "owner"}} AND token = {{arg "token"}} AND state = {{.State.InProgress}} AND forget_us > {{.Now}}
{{- end}}

{{- /* What acquired.scan reads, in order. */ -}}
{{define "acquired columns" -}}
state, owner, token, attempt, how, lease_expires_us, completed_us, fingerprint, output, {{.Now}}
{{- end}}

{{- /* What scanRecord reads, in order: the lease's end is the completion
for a completed record and the release for a released one, which is kept
for its retention from then; the eighth column is when the record stops
counting. */ -}}
{{define "record columns" -}}
`key`, state, owner, token, attempt,
    CASE state WHEN {{.State.Completed}} THEN completed_us WHEN {{.State.Released}} THEN forget_us - retention_us ELSE lease_expires_us END,
    completed_us, {{.Until}}, fingerprint, output, {{.Now}}, acquired_us, origin
{{- end}}

{{- /* Acquire in one statement, on MariaDB 10.5+. */ -}}
{{define "acquire returning" -}}
{{template "acquire" .}}
RETURNING {{template "acquired columns" .}}
{{- end}}

{{- /* Acquire's first statement on MariaDB 10.5+: the insert of a new
record, whose update changes nothing, so that a record already there is
left as it was, locked, and returned. The row then tells (acquired.settled
in mysqlstore.go) whether it answers the Acquire as the upsert would: a
record this statement inserted, a completed record or another owner's
live lease, with a fingerprint if the call brings one. Any other row, one
the upsert would change, sends the upsert. The two columns after those of
the upsert are when the record's lease was acquired, which for the row
this statement inserted is its own time, and whether the record still
counts. The key comes first: a batch of calls sends one row of values
each, and reads one row back for each, in the same order. */ -}}
{{define "acquire first" -}}
{{template "acquire insert" .}}
ON DUPLICATE KEY UPDATE `key` = `key`
RETURNING `key`, {{template "acquired columns" .}}, acquired_us, {{.Until}} > {{.Now}}
{{- end}}

{{- /* The row the upsert left, read in its transaction on MySQL. */ -}}
{{define "acquire read" -}}
SELECT {{template "acquired columns" .}} FROM {{.Table}} WHERE `key` = {{arg "key"}}
{{- end}}

{{define "renew" -}}
UPDATE {{.Table}} SET lease_expires_us = {{.Now}} + {{arg "ttl"}}, forget_us = {{.Now}} + {{arg "ttl"}} + retention_us
WHERE {{template "held" .}}
{{- end}}

{{- /* A record's completed_us is 0 until it completes (NULL in rows
an earlier release wrote), so the time written over it keeps the record's size
and InnoDB updates the record in place; filling a NULL would lengthen it,
and InnoDB would write it anew in its page. */ -}}
{{define "complete" -}}
UPDATE {{.Table}} SET state = {{.State.Completed}}, completed_us = {{.Now}}, output = {{arg "output"}},
    forget_us = GREATEST(forget_us, {{.Now}} + retention_us)
WHERE {{template "held" .}}
{{- end}}

{{define "release" -}}
UPDATE {{.Table}} SET state = {{.State.Released}}, forget_us = {{.Now}} + retention_us
WHERE {{template "held" .}}
{{- end}}

{{- /* Whether an update that changed no row matched the record anyway. */ -}}
{{define "still held" -}}
SELECT 1 FROM {{.Table}} WHERE {{template "held" .}}
{{- end}}

{{define "inspect" -}}
SELECT {{template "record columns" .}} FROM {{.Table}}
WHERE `key` = {{arg "key"}} AND {{.Until}} > {{.Now}}
{{- end}}

{{- /* A page of a namespace's key range: "upper" is NULL for every key.
"state" is a state code, NULL for any; "live", for a lease in progress,
whether it must be live (TRUE) or expired (FALSE), NULL for either, as
Inspect judges it. */ -}}
{{define "list" -}}
SELECT {{template "record columns" .}} FROM {{.Table}}
WHERE {{.Until}} > {{.Now}}
    AND `key` > {{arg "after"}} AND `key` >= {{arg "lower"}} AND ({{arg "upper"}} IS NULL OR `key` < {{arg "upper"}})
    AND ({{arg "state"}} IS NULL OR state = {{arg "state"}})
    AND ({{arg "live"}} IS NULL OR (lease_expires_us > {{.Now}}) = {{arg "live"}})
ORDER BY `key` LIMIT {{arg "limit"}}
{{- end}}

{{- /* The records of a namespace's key range by backends.State, and the
oldest live lease's acquisition (NULL without one). */ -}}
{{define "count" -}}
SELECT COALESCE(SUM(state = {{.State.InProgress}} AND lease_expires_us > {{.Now}}), 0),
    COALESCE(SUM(state = {{.State.InProgress}} AND lease_expires_us <= {{.Now}}), 0),
    COALESCE(SUM(state = {{.State.Released}}), 0), COALESCE(SUM(state = {{.State.Completed}}), 0),
    MIN(IF(state = {{.State.InProgress}} AND lease_expires_us > {{.Now}}, acquired_us, NULL))
FROM {{.Table}}
WHERE {{.Until}} > {{.Now}} AND `key` >= {{arg "lower"}} AND ({{arg "upper"}} IS NULL OR `key` < {{arg "upper"}})
{{- end}}

{{define "delete live" -}}
DELETE FROM {{.Table}} WHERE `key` = {{arg "key"}} AND {{.Until}} > {{.Now}}
{{- end}}

{{define "delete any" -}}
DELETE FROM {{.Table}} WHERE `key` = {{arg "key"}}
{{- end}}

{{define "cleanup" -}}
DELETE FROM {{.Table}} WHERE forget_us <= {{.Now}} ORDER BY forget_us LIMIT {{arg "batch"}}
{{- end}}

{{- /* Migrate's statements. GET_LOCK's name and timeout are parameters;
"add columns" is rendered when Migrate runs, with the columns the table
lacks as .Add, each a name and its definition. */ -}}
{{define "database" -}}
SELECT DATABASE()
{{- end}}

{{define "get lock" -}}
SELECT GET_LOCK({{arg "lock"}}, {{arg "seconds"}})
{{- end}}

{{define "release lock" -}}
DO RELEASE_LOCK({{arg "lock"}})
{{- end}}

{{define "columns" -}}
SELECT COLUMN_NAME FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = COALESCE({{arg "database"}}, DATABASE()) AND TABLE_NAME = {{arg "table"}}
{{- end}}

{{define "short lock wait" -}}
SET SESSION lock_wait_timeout = 1
{{- end}}

{{define "default lock wait" -}}
SET SESSION lock_wait_timeout = DEFAULT
{{- end}}

{{define "add columns" -}}
ALTER TABLE {{.Table}} {{range $i, $c := .Add}}{{if $i}}, {{end}}ADD COLUMN {{index $c 0}} {{index $c 1}}{{end}}
{{- end}}

{{- /* The server's version, which says its dialect (flavorOf). */ -}}
{{define "version" -}}
SELECT VERSION()
{{- end}}

{{- /* Complete for several calls (.Calls, their indexes), of distinct
keys, on MariaDB: one statement, one commit. Each record is updated as
"complete" updates it, with its call's output, only while its call's
lease holds it; the key list makes it a lookup of those rows by the
primary key. */ -}}
{{define "complete together" -}}
UPDATE {{.Table}} SET state = {{.State.Completed}}, completed_us = {{.Now}},
    output = CASE `key`{{range $i := .Calls}} WHEN {{argAt "key" $i}} THEN {{argAt "output" $i}}{{end}} END,
    forget_us = GREATEST(forget_us, {{.Now}} + retention_us)
WHERE `key` IN ({{range $i := .Calls}}{{if $i}}, {{end}}{{argAt "key" $i}}{{end}}) AND state = {{.State.InProgress}} AND forget_us > {{.Now}}
    AND CASE `key`{{range $i := .Calls}} WHEN {{argAt "key" $i}} THEN owner = {{argAt "owner" $i}} AND token = {{argAt "token" $i}}{{end}} END
{{- end}}

{{- /* Whether a lease completed its record: after a statement of
several completions that changed fewer rows than it had calls. */ -}}
{{define "completed by" -}}
SELECT 1 FROM {{.Table}} WHERE `key` = {{arg "key"}} AND owner = {{arg "owner"}} AND token = {{arg "token"}} AND state = {{.State.Completed}}
{{- end}}
