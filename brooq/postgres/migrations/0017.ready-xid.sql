-- depends: 0016.fair-cursor

-- A claim that a held snapshot cannot slow down (issue 31, docs/architecture.md "Claims
-- from floors"). A claimer reads each priority level of a topic from where its last claim
-- at that level stopped (its floor), so it never walks again the index entries of the rows
-- it already claimed: under a held snapshot those entries stay, pointing at versions no
-- vacuum may remove. A row can become ready behind a floor only in the transaction that
-- makes it ready, so every row carries that transaction's id, and a claimer asks for the
-- rows made ready since its previous look (PgQ's rule: committed now, not in the snapshot
-- it looked with) to lower its floors.
--
-- No rewrite of the table: the column is added without a default (existing rows keep
-- NULL: a claimer reads every level from its start once, when it begins), then given one
-- for the rows inserted from now on. The trigger stamps the updates that make a row ready
-- or move it within the claim order: a retry, a release, the reaper, a workflow child
-- released, `brooq jobs retry` and `retarget`, a hand-made UPDATE.
ALTER TABLE job ADD COLUMN ready_xid xid8;
ALTER TABLE job ALTER COLUMN ready_xid SET DEFAULT pg_current_xact_id();

CREATE FUNCTION brooq_stamp_ready() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.ready_xid := pg_current_xact_id();
    RETURN NEW;
END
$$;

CREATE TRIGGER job_ready_stamp BEFORE UPDATE ON job
    FOR EACH ROW
    WHEN (NEW.state IN ('pending', 'failed')
          AND (OLD.state, OLD.topic, OLD.priority, OLD.available_at, OLD.app_version)
              IS DISTINCT FROM (NEW.state, NEW.topic, NEW.priority, NEW.available_at,
                                NEW.app_version))
    EXECUTE FUNCTION brooq_stamp_ready();

-- The rows made ready since a claimer's previous look, per topic: a range from the oldest
-- transaction that claimer had not seen end. Partial: a row leaves it when it is claimed.
-- Its predicate holds the waiting rows too (a few) so that it differs from
-- job_claim_idx's: the look names it, and no plan can read the look through the claim
-- index, which would walk the topic's whole range.
CREATE INDEX job_ready_xid_idx ON job (topic, ready_xid)
    WHERE state IN ('pending', 'failed', 'waiting');
