-- Snapshots are numbered per tenant (docs/upgrades.md, "Snapshots and restores"): the API
-- showed the global row id, which told an owner how many snapshots the whole fleet had taken.
-- `number` is what the API, the audit trail and the snapshot's file name show; `id` stays the
-- key the restores and upgrades refer to. Existing snapshots keep their id as their number, so
-- every id handed out before names the same snapshot of the same tenant, and each tenant's
-- next snapshot continues after its highest. Forward-only; never edit once landed.
ALTER TABLE etcd_snapshots ADD COLUMN number BIGINT;
UPDATE etcd_snapshots SET number = id;
ALTER TABLE etcd_snapshots ALTER COLUMN number SET NOT NULL;
ALTER TABLE etcd_snapshots ADD CONSTRAINT etcd_snapshots_number_per_tenant
    UNIQUE (tenant_id, number);

-- The highest snapshot number a tenant has handed out, taken under the tenant's row lock
-- (every transaction that asks for a snapshot holds it already), so numbers are never reused.
ALTER TABLE tenants ADD COLUMN snapshot_numbers BIGINT NOT NULL DEFAULT 0;
UPDATE tenants t SET snapshot_numbers = s.highest
    FROM (SELECT tenant_id, max(number) AS highest FROM etcd_snapshots GROUP BY tenant_id) s
    WHERE s.tenant_id = t.id;
