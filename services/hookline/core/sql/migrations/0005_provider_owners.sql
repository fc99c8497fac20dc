-- Hookline schema, version 5: who owns a provider name, and operator statistics from indexes.
--
-- Public provider names stay cluster-unique (the receiver URL is /webhooks/{name}),
-- so the row records who claimed the name:
--   managed_by = 'operator'  a WebhookProvider resource owns it: owner_namespace,
--                            owner_name and owner_uid (metadata.uid) say which one;
--   managed_by = 'cli'       `hookline providers apply` owns it (no owner columns);
--   managed_by IS NULL       the row was written before this migration, by either.
-- The operator writes a row only when owner_uid is its resource's uid, and deletes
-- only such rows; the CLI writes and deletes only rows without an owner_uid.
--
-- Rows from before this migration: the operator used to upsert by name alone, so
-- after the upgrade nothing says whether a row came from the CLI or from which
-- resource. Marking them all CLI-owned would leave every existing WebhookProvider
-- in NameConflict; letting any resource adopt them would hand one team's row to
-- whichever namespace reconciles first. So a row with managed_by NULL is adopted
-- by an operator claim only with proof that it was synced from that very
-- resource: its stored secrets include the resource's current signing secret
-- (or, for scheme none, its stored spec equals the resource's spec). Another
-- namespace's resource with the same name has a different generated secret and
-- gets NameConflict. The CLI adopts such rows when it applies them (it always
-- overwrote them before).
ALTER TABLE hookline.providers
    ADD COLUMN managed_by      text CHECK (managed_by IN ('cli', 'operator')),
    ADD COLUMN owner_namespace text,
    ADD COLUMN owner_name      text,
    ADD COLUMN owner_uid       text,
    ADD CONSTRAINT providers_owner_consistent CHECK (
        CASE WHEN managed_by = 'operator'
             THEN owner_namespace IS NOT NULL AND owner_name IS NOT NULL AND owner_uid IS NOT NULL
             ELSE owner_namespace IS NULL AND owner_name IS NULL AND owner_uid IS NULL
        END);
-- New rows always say who wrote them (existing rows keep NULL, see above).
ALTER TABLE hookline.providers ALTER COLUMN managed_by SET DEFAULT 'cli';

-- Annotation tokens belong to a resource, not to a name: when the name changes
-- hands, the new owner's "t1" is not the old owner's "t1". Tokens recorded before
-- this migration keep resource_uid '' (their resources also recorded the token in
-- status.*.lastHandledToken, which is checked first).
ALTER TABLE hookline.operator_tokens
    ADD COLUMN resource_uid text NOT NULL DEFAULT '',
    DROP CONSTRAINT operator_tokens_pkey,
    ADD PRIMARY KEY (provider, resource_uid, kind, token);

-- The operator's one statistics query per tick (queries.sql, provider_stats)
-- counts events backing off after a failure. Rows enter this index only when an
-- attempt failed (attempts > 0 while pending, not deferred), so new events and
-- claims, the hot path, never write to it; the other parts of that query read
-- the existing partial indexes (claimable, deferred, leased, dead).
CREATE INDEX inbox_retrying_idx ON hookline.inbox (provider, next_attempt_at)
    WHERE status = 'pending' AND attempts > 0 AND deferred_since IS NULL;
