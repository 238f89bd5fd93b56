{{- /*
The store's statements but the schema (schema.sql) and the acquire
function (acquire.sql), and the fragments they share: templates, each
rendered once by New with an sqlData (sql.go). .Table, .Live, .Acquire
are quoted, schema-qualified names; .State and .How hold the codes of the
state and how columns, which are stored: the statements speak of states
only through them. Comments are template comments, so that none is sent
to the server.
*/ -}}

{{- /* The time until which the record in row .Row (an alias and a dot,
or empty) counts: for a completed record, its completion plus its
retention; for any other, forget_at. A completion within its lease leaves
forget_at as Acquire set it, the lease's end plus the retention (see
"complete"), so that the update changes no indexed column and Postgres
can make it a HOT update; forget_at is then only a bound, and cleanup,
which reads its index, deletes a completed record once both times have
passed. */ -}}
{{define "until" -}}
(CASE WHEN {{.Row}}state = {{.State.Completed}} THEN {{.Row}}completed_at + {{.Row}}retention_us * interval '1 microsecond' ELSE {{.Row}}forget_at END)
{{- end}}

{{- /* The row of a live lease in progress. */ -}}
{{define "live lease" -}}
state = {{.State.InProgress}} AND lease_expires_at > now() AND {{.Live}}(forget_at)
{{- end}}

{{- /* The row of the lease ($1 key, $2 owner, $3 token) while it holds
the key. The liveness function, on the row found by its key, keeps the
plan on the primary key (schema.sql). */ -}}
{{define "held" -}}
key = $1 AND owner = $2 AND token = $3 AND state = {{.State.InProgress}} AND {{.Live}}(forget_at)
{{- end}}

{{- /* A statement that ends a lease or deletes a record notifies the
key's watchers if a watch marked its row (waited), in the same statement,
on the row as it locked it; an UPDATE clears the mark as it notifies
("clear waited"), a DELETE returns whether it did ("notified"). A row
nobody watched sends nothing. pg_notify returns void, which is never
NULL. */ -}}
{{define "notify" -}}
pg_notify({{literal .Channel}}, md5(key))
{{- end}}
{{define "clear waited" -}}
waited = CASE WHEN waited THEN {{template "notify" .}} IS NULL ELSE false END
{{- end}}
{{define "notified" -}}
CASE WHEN waited THEN {{template "notify" .}} IS NOT NULL END AS notified
{{- end}}

{{- /* The columns scanRecord reads, in order: the lease's end is the
completion for a completed record and the release for a released one,
which is kept for its retention from then; the eighth column is when the
record stops counting. */ -}}
{{define "record columns" -}}
key, state, owner, token, attempt,
    CASE state WHEN {{.State.Completed}} THEN completed_at WHEN {{.State.Released}} THEN forget_at - retention_us * interval '1 microsecond' ELSE lease_expires_at END,
    completed_at, {{template "until" .}}, fingerprint, output, now(), acquired_at, origin
{{- end}}

{{- /* Whether the table, the columns added since its first release, its
index and the liveness function exist, and whether the acquire function
does with this version's body ($1): then Migrate has nothing to do and
takes no lock. */ -}}
{{define "current" -}}
SELECT to_regclass({{literal .QualifiedIndex}}) IS NOT NULL
    AND to_regprocedure({{literal (print .Live "(timestamptz)")}}) IS NOT NULL
    AND (SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass({{literal .Table}})
        AND attname IN ({{range $i, $c := .AddedColumns}}{{if $i}}, {{end}}{{literal $c}}{{end}}) AND NOT attisdropped) = {{len .AddedColumns}},
    coalesce((SELECT prosrc = $1 FROM pg_proc WHERE oid = to_regprocedure({{literal (print .Acquire (include "acquire args" .))}})), false)
{{- end}}

{{- /* Migrate's transaction: the advisory lock ($1) that instances
migrating at once take in turn, and the bound on its wait for a table's
lock. */ -}}
{{define "migration lock" -}}
SELECT pg_advisory_xact_lock($1)
{{- end}}
{{define "lock timeout" -}}
SET LOCAL lock_timeout = {{literal .LockTimeout}}
{{- end}}

{{- /* Acquire: key $1, owner $2, lease TTL $3 µs, retention $4 µs,
fingerprint $5, origin $6 (acquire.sql). */ -}}
{{define "acquire" -}}
SELECT * FROM {{.Acquire}}($1, $2, $3, $4, $5, $6)
{{- end}}

{{- /* Renew, Complete and Release: the lease's key $1, owner $2 and
token $3; the new TTL $4 µs for Renew, the output $4 for Complete.
forget_at moves only for a completion after the lease's end. */ -}}
{{define "renew" -}}
UPDATE {{.Table}} SET lease_expires_at = now() + $4::bigint * interval '1 microsecond',
    forget_at = now() + ($4::bigint + retention_us) * interval '1 microsecond'
    WHERE {{template "held" .}}
{{- end}}
{{define "complete" -}}
UPDATE {{.Table}} SET state = {{.State.Completed}}, completed_at = now(), output = $4,
    forget_at = greatest(forget_at, now() + retention_us * interval '1 microsecond'), {{template "clear waited" .}}
    WHERE {{template "held" .}}
{{- end}}
{{define "release" -}}
UPDATE {{.Table}} SET state = {{.State.Released}},
    forget_at = now() + retention_us * interval '1 microsecond', {{template "clear waited" .}}
    WHERE {{template "held" .}}
{{- end}}

{{- /* Inspect: key $1. */ -}}
{{define "inspect" -}}
SELECT {{template "record columns" .}} FROM {{.Table}} WHERE key = $1 AND {{.Live}}({{template "until" .}})
{{- end}}

{{- /* List: a page of the keys after $1 in the range from $2 up to $3
(NULL: no end), in the state $4 (a code of the state column; NULL: any),
whose lease is live or not as $5 says (NULL: either), $6 at most; one
range scan of the primary key. */ -}}
{{define "list" -}}
SELECT {{template "record columns" .}} FROM {{.Table}}
    WHERE {{template "until" .}} > now() AND key > $1 AND key >= $2 AND ($3::bytea IS NULL OR key < $3)
        AND ($4::smallint IS NULL OR state = $4) AND ($5::boolean IS NULL OR (lease_expires_at > now()) = $5)
    ORDER BY key LIMIT $6
{{- end}}

{{- /* Count: the records of each backends.State, and the oldest live
lease's acquisition, in the range from $1 up to $2 (NULL: no end). */ -}}
{{define "count" -}}
SELECT count(*) FILTER (WHERE state = {{.State.InProgress}} AND lease_expires_at > now()),
        count(*) FILTER (WHERE state = {{.State.InProgress}} AND lease_expires_at <= now()),
        count(*) FILTER (WHERE state = {{.State.Released}}), count(*) FILTER (WHERE state = {{.State.Completed}}),
        min(acquired_at) FILTER (WHERE state = {{.State.InProgress}} AND lease_expires_at > now())
    FROM {{.Table}} WHERE {{template "until" .}} > now() AND key >= $1 AND ($2::bytea IS NULL OR key < $2)
{{- end}}

{{- /* Delete: key $1; whether it counted, and whether it notified. The
liveness function's answer is not needed here, only its cost. */ -}}
{{define "delete" -}}
WITH d AS (DELETE FROM {{.Table}} WHERE key = $1 AND {{.Live}}({{template "until" .}}) IS NOT NULL
    RETURNING {{template "until" .}} > now() AS live, {{template "notified" .}})
SELECT count(*) FILTER (WHERE live), count(notified) FROM d
{{- end}}

{{- /* Cleanup: up to $1 records past forget_at, oldest first, skipping
the rows other cleanups hold. */ -}}
{{define "cleanup" -}}
WITH d AS (DELETE FROM {{.Table}} WHERE key IN (SELECT key FROM {{.Table}}
    WHERE forget_at <= now() ORDER BY forget_at LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING {{template "notified" .}})
SELECT count(*), count(notified) FROM d
{{- end}}

{{- /* Watch: marks the row of key $1's lease in progress, only if it is
not marked yet; the second column is the mark as the statement's snapshot
saw it, NULL if the key held no lease in progress. */ -}}
{{define "watch" -}}
WITH u AS (UPDATE {{.Table}} SET waited = true WHERE key = $1 AND NOT waited AND {{template "live lease" .}} RETURNING true)
SELECT EXISTS (SELECT FROM u), (SELECT waited FROM {{.Table}} WHERE key = $1 AND {{template "live lease" .}})
{{- end}}

{{- /* The listener's LISTEN, and its ping: the same as a comment, so
that pg_stat_activity shows its purpose either way. */ -}}
{{define "listen" -}}
LISTEN {{ident .Channel}}
{{- end}}
{{define "ping" -}}
-- {{template "listen" .}}
{{- end}}
