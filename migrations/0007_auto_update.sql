-- Automatic patch updates (docs/upgrades.md, "Automatic patch updates"). A tenant runs one
-- release of its minor (`release`, e.g. 'v1.37.1'), kept until something moves it: an
-- upgrade, or an automatic patch update in its maintenance window when the tenant (or its
-- plan) opted in with `auto_update = 'patch'`. Forward-only; never edit once landed.

-- NULL: the plan's setting (off when the plan has none).
ALTER TABLE tenants ADD COLUMN auto_update TEXT CHECK (auto_update IN ('off', 'patch'));
-- The release the control plane runs. NULL only for rows written before this migration that
-- the backfill below could not place: they run their minor's release in the catalog.
ALTER TABLE tenants ADD COLUMN release TEXT;
UPDATE tenants t SET release = v.kubernetes FROM versions v WHERE v.minor = t.version;

-- The releases of an upgrade's current hop: where a rollback returns to and where the hop
-- goes. A hop between minors goes to the new minor's release in the catalog; a patch update
-- is one hop inside a minor (hop_from = hop_to), from one release to another.
ALTER TABLE tenant_upgrades
    ADD COLUMN hop_from_release TEXT,
    ADD COLUMN hop_to_release TEXT;
