-- Retention follows a snapshot to its copies (docs/orchestrator.md, "Clones"): pruning a
-- source's snapshot marks the clones' copies of it pruned too, and an object a clone has yet
-- to restore from is kept until that restore ends. Both look a snapshot's copies up by
-- `copied_from`, which only clones' rows set. Forward-only; never edit once landed.
CREATE INDEX etcd_snapshots_copied_from ON etcd_snapshots (copied_from)
    WHERE copied_from IS NOT NULL;
