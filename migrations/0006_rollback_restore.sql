-- A rollback that restores the snapshot taken before the failed hop (docs/upgrades.md, "What a
-- rollback can and cannot undo"): when the hop moved etcd or the catalog marks its minor as a
-- storage change, the rollback starts a restore of the hop's snapshot in the same transaction
-- and links it here, so the upgrade shows it. Forward-only; never edit once landed.
ALTER TABLE tenant_upgrades ADD COLUMN restore_id BIGINT REFERENCES etcd_restores (id);
