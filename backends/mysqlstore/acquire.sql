{{- /* Acquire's upsert: takes the lease on key :key for owner :owner or
leaves the record as it is, in one statement; the conflicting row is
locked, so concurrent callers are serialised on it.

Assignments in ON DUPLICATE KEY UPDATE run left to right and each sees
the new values of those before it, so `how` is decided first, from the
old row, and every later assignment reads only `how` and its own column's
old value. `how` is what this Acquire did (the how codes in
mysqlstore.go): howFresh, a new record (or one past its retention);
howTakeover, a takeover of an expired lease; howReentrant, the owner's
own lease again; howAfterRelease, after a release; and old + howUnchanged
until the last assignment: nothing, the row ends as it was. A new lease
(howFresh, howTakeover, howAfterRelease) gets this call's origin and
time; the owner's own keeps those it had.

When the Acquire changes nothing (the key is held by another owner, or
completed), `how` holds its old value plus howUnchanged while the later
assignments keep their columns, and the last assignment puts it back: the
row ends as it was, so the server writes nothing, and a duplicate only
locks and reads the row (a fingerprint to adopt is the one change it
makes).

The parameters are bound again in the update instead of VALUES(), which
MySQL 8.0.20+ deprecates and whose replacement MariaDB lacks.

A new record's completed_us is 0, not NULL (see "complete" in
statements.sql).

Its INSERT ("acquire insert") also begins "acquire first" (statements.sql),
which on MariaDB runs before it and leaves it the records it changes.

These comments are kept out of the SQL sent: the server shows a
statement's first 1,024 characters in INNODB_TRX. */ -}}

{{define "acquire insert" -}}
INSERT INTO {{.Table}}
    (`key`, state, owner, origin, token, attempt, how, acquired_us, lease_expires_us, retention_us, forget_us, completed_us, fingerprint)
VALUES
{{- /* A new record's values, a row for each call (.Calls: one, but in
"acquire first" for a batch of Acquire calls on MariaDB). */ -}}
{{range $i := .Calls}}{{if $i}},{{end}}
    ({{argAt "key" $i}}, {{$.State.InProgress}}, {{argAt "owner" $i}}, {{argAt "origin" $i}}, 1, 1, {{$.How.Fresh}}, {{$.Now}}, {{$.Now}} + {{argAt "ttl" $i}}, {{argAt "ret" $i}}, {{$.Now}} + {{argAt "ttl" $i}} + {{argAt "ret" $i}}, 0, {{argAt "fp" $i}})
{{- end}}
{{- end}}

{{define "acquire" -}}
{{- $new := printf "how IN (%d, %d, %d)" .How.Fresh .How.Takeover .How.AfterRelease -}}
{{- $unchanged := printf "how >= %d" .How.Unchanged -}}
{{template "acquire insert" .}}
ON DUPLICATE KEY UPDATE
    how              = CASE WHEN {{.Until}} <= {{.Now}} THEN {{.How.Fresh}}
                            WHEN state = {{.State.Released}} THEN {{.How.AfterRelease}}
                            WHEN state = {{.State.InProgress}} AND owner = {{arg "owner"}} THEN {{.How.Reentrant}}
                            WHEN state = {{.State.InProgress}} AND lease_expires_us <= {{.Now}} THEN {{.How.Takeover}}
                            ELSE how + {{.How.Unchanged}} END,
    token            = IF({{$new}}, token + 1, token),
    attempt          = CASE how WHEN {{.How.Fresh}} THEN 1 WHEN {{.How.Takeover}} THEN attempt + 1 WHEN {{.How.AfterRelease}} THEN attempt + 1 ELSE attempt END,
    origin           = IF({{$new}}, {{arg "origin"}}, origin),
    acquired_us      = IF({{$new}}, {{.Now}}, acquired_us),
    fingerprint      = IF(how = {{.How.Fresh}}, {{arg "fp"}}, COALESCE(fingerprint, {{arg "fp"}})),
    completed_us     = IF(how = {{.How.Fresh}}, 0, completed_us),
    output           = IF(how = {{.How.Fresh}}, NULL, output),
    retention_us     = IF({{$unchanged}}, retention_us, {{arg "ret"}}),
    lease_expires_us = IF({{$unchanged}}, lease_expires_us, {{.Now}} + {{arg "ttl"}}),
    forget_us        = IF({{$unchanged}}, forget_us, {{.Now}} + {{arg "ttl"}} + {{arg "ret"}}),
    owner            = IF({{$unchanged}}, owner, {{arg "owner"}}),
    state            = IF({{$unchanged}}, state, {{.State.InProgress}}),
    how              = IF({{$unchanged}}, how - {{.How.Unchanged}}, how)
{{- end}}
