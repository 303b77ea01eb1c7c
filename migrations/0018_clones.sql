-- Clones (issue 29; docs/orchestrator.md, "Clones"): a tenant created from an uploaded snapshot
-- of another tenant (live or deleted). The clone gets a copy of that snapshot's row as its own
-- snapshot 1 (same object, SHA-256 and backup key: the object is not copied), and its first
-- pass after it is up restores from it. Forward-only; never edit once landed.

-- The snapshot a copy was made from (provenance; the copy is what the clone restores).
ALTER TABLE etcd_snapshots ADD COLUMN copied_from BIGINT REFERENCES etcd_snapshots (id);

-- The clone's copy to restore once it is up; NULL for a tenant created empty.
ALTER TABLE tenants ADD COLUMN seed_snapshot_id BIGINT REFERENCES etcd_snapshots (id);
