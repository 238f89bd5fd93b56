-- The retention statement of docs/outbox.md, run by TestPruneAsDocumented
-- with the test's table names and no age.

-- snippet:prune
DELETE FROM watermill_outbox m
USING watermill_offsets_outbox o
WHERE o.consumer_group = ''
  AND (m.transaction_id < o.last_processed_transaction_id
       OR (m.transaction_id = o.last_processed_transaction_id AND m."offset" <= o.offset_acked))
  AND m.created_at < now() - interval '7 days';
-- end snippet
