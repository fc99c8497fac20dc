-- Hookline schema, version 15: a provider name that changes hands leaves its previous
-- owner's data behind, archived (issue 9).
--
-- Events, dedup keys, entity states, body hashes and the attempt log are keyed by the
-- public provider name. When a WebhookProvider resource gives the name up (its row is
-- deleted by release_provider) or loses it to a claimant that proved it deleted
-- (claim_provider with $9), whatever the name still holds is the previous owner's:
-- the next owner's workers must not process its pending events (team A's partner
-- data sent to team B's handler), its tenant role must not read them, its status must
-- not count them, its replay must not requeue them, and a partner that happens to
-- reuse an event id must not be answered "duplicate".
--
-- So those rows move, never deleted, under an archival name: name || '@' || owner uid.
-- '@' is not allowed in a provider name (a DNS label, core/provider_spec.py), so no
-- providers row can ever carry that name, and therefore: no worker claims its pending
-- rows (workers claim by the name they serve), no tenant role sees them (row-level
-- security admits names of its namespace's providers rows), the operator's statistics
-- belong to no resource, and replay_owned_dead requeues only an owned name's rows.
-- States are kept as they were (pending stays pending, processing is left to its
-- lease); an operator can inspect them with `hookline events` under the archival name.
--
-- One point covers every path: a trigger on hookline.providers, in the statement that
-- releases or takes over the name. Rows the CLI wrote (no owner_uid) and the adoption
-- of a row from before migration 0005 (proven the same resource) move nothing.
-- Events a receiver stored under a released name before it reloaded its providers are
-- the releasing owner's too: the release is remembered (hookline.released_provider_names)
-- and whoever next writes a row of that name (a resource or the CLI) first moves them to
-- that owner's archive. A name the CLI deleted is handed over with its events, as before.

-- The archival name of a previous owner's rows.
CREATE FUNCTION hookline.archived_provider_name(provider_name text, owner_uid text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT provider_name || '@' || owner_uid
$$;

-- Move everything stored under a provider name to its archival name; returns how many
-- inbox events moved. Keyed tables whose archival key already exists (only if the
-- same owner's rows were archived before) keep that archived row and the public one
-- goes, so a release never fails on a key; inbox rows and the attempt log have no
-- such key and always move. Definer's rights: the operator's role need not write the
-- workers' tables.
CREATE FUNCTION hookline.archive_provider_events(provider_name text, owner_uid text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    archived text := hookline.archived_provider_name(provider_name, owner_uid);
    moved    bigint;
BEGIN
    UPDATE hookline.inbox SET provider = archived WHERE provider = provider_name;
    GET DIAGNOSTICS moved = ROW_COUNT;

    UPDATE hookline.inbox_keys AS k SET provider = archived
    WHERE k.provider = provider_name
      AND NOT EXISTS (SELECT FROM hookline.inbox_keys AS a WHERE a.provider = archived AND a.event_id = k.event_id);
    DELETE FROM hookline.inbox_keys WHERE provider = provider_name;

    UPDATE hookline.entity_states AS s SET provider = archived
    WHERE s.provider = provider_name
      AND NOT EXISTS (SELECT FROM hookline.entity_states AS a
                      WHERE a.provider = archived AND a.entity_key = s.entity_key);
    DELETE FROM hookline.entity_states WHERE provider = provider_name;

    UPDATE hookline.inbox_body_hashes AS h SET provider = archived
    WHERE h.provider = provider_name
      AND NOT EXISTS (SELECT FROM hookline.inbox_body_hashes AS a
                      WHERE a.provider = archived AND a.body_sha256 = h.body_sha256);
    DELETE FROM hookline.inbox_body_hashes WHERE provider = provider_name;

    UPDATE hookline.attempts SET part = archived WHERE queue = 'inbox' AND part = provider_name;
    RETURN moved;
END $$;

CREATE FUNCTION hookline.archive_previous_owner() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM hookline.archive_provider_events(OLD.name, OLD.owner_uid);
    RETURN NULL;
END $$;

-- The last operator owner of each name that has no row now.
CREATE TABLE hookline.released_provider_names (
    name         text PRIMARY KEY,
    owner_uid    text NOT NULL,
    released_at  timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION hookline.remember_released_name() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO hookline.released_provider_names (name, owner_uid) VALUES (OLD.name, OLD.owner_uid)
    ON CONFLICT (name) DO UPDATE SET owner_uid = EXCLUDED.owner_uid, released_at = now();
    RETURN NULL;
END $$;

CREATE FUNCTION hookline.archive_late_events() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    released_by text;
BEGIN
    DELETE FROM hookline.released_provider_names WHERE name = NEW.name RETURNING owner_uid INTO released_by;
    IF released_by IS NOT NULL THEN
        PERFORM hookline.archive_provider_events(NEW.name, released_by);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER providers_name_reused AFTER INSERT ON hookline.providers
    FOR EACH ROW EXECUTE FUNCTION hookline.archive_late_events();
CREATE TRIGGER providers_release_remembered AFTER DELETE ON hookline.providers
    FOR EACH ROW WHEN (OLD.owner_uid IS NOT NULL)
    EXECUTE FUNCTION hookline.remember_released_name();
CREATE TRIGGER providers_owner_released AFTER DELETE ON hookline.providers
    FOR EACH ROW WHEN (OLD.owner_uid IS NOT NULL)
    EXECUTE FUNCTION hookline.archive_previous_owner();
CREATE TRIGGER providers_owner_replaced AFTER UPDATE OF owner_uid ON hookline.providers
    FOR EACH ROW WHEN (OLD.owner_uid IS NOT NULL AND OLD.owner_uid IS DISTINCT FROM NEW.owner_uid)
    EXECUTE FUNCTION hookline.archive_previous_owner();
