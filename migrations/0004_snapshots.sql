-- etcd snapshots of tenants and restores from them (docs/upgrades.md, "Snapshots"). A
-- snapshot is asked for (Pending), taken by a Job in the tenant's control-plane namespace and
-- recorded with what etcd reported; an upgrade takes one before each hop.
CREATE TABLE etcd_snapshots (
    id BIGSERIAL PRIMARY KEY,
    tenant_id BIGINT NOT NULL REFERENCES tenants (id),
    -- The upgrade that took it before one of its hops; NULL when asked for through the API.
    upgrade_id BIGINT REFERENCES tenant_upgrades (id),
    -- The tenant's minor when it was asked for.
    version TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state = ANY (ARRAY['Pending', 'Succeeded', 'Failed'])),
    reason TEXT,
    -- What etcd reported: the store's revision, the file's size and SHA-256 (hex).
    revision BIGINT,
    size_bytes BIGINT,
    sha256 TEXT,
    storage_version TEXT,
    -- pvc://<namespace>/<claim>/<file>
    location TEXT NOT NULL,
    requested_by TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at TIMESTAMPTZ,
    CHECK (state <> 'Succeeded'
           OR (revision IS NOT NULL AND size_bytes IS NOT NULL AND sha256 IS NOT NULL))
);
CREATE INDEX etcd_snapshots_by_tenant ON etcd_snapshots (tenant_id, id DESC);

CREATE TABLE etcd_restores (
    id BIGSERIAL PRIMARY KEY,
    tenant_id BIGINT NOT NULL REFERENCES tenants (id),
    snapshot_id BIGINT NOT NULL REFERENCES etcd_snapshots (id),
    state TEXT NOT NULL CHECK (state = ANY (ARRAY['Running', 'Succeeded', 'Failed'])),
    -- Every member's restore Job succeeded: from here on the control plane only starts again.
    restored BOOLEAN NOT NULL DEFAULT false,
    reason TEXT,
    requested_by TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at TIMESTAMPTZ
);
-- At most one restore moves a tenant at a time.
CREATE UNIQUE INDEX etcd_restores_one_active ON etcd_restores (tenant_id) WHERE state = 'Running';

-- An upgrade snapshots the tenant before each hop: state Snapshotting, with the hop's snapshot.
ALTER TABLE tenant_upgrades ADD COLUMN snapshot_id BIGINT REFERENCES etcd_snapshots (id);
ALTER TABLE tenant_upgrades DROP CONSTRAINT tenant_upgrades_state_check;
ALTER TABLE tenant_upgrades ADD CONSTRAINT tenant_upgrades_state_check
    CHECK (state IN ('Snapshotting', 'Running', 'RollingBack', 'Succeeded', 'RolledBack'));
DROP INDEX tenant_upgrades_one_active;
CREATE UNIQUE INDEX tenant_upgrades_one_active ON tenant_upgrades (tenant_id)
    WHERE state IN ('Snapshotting', 'Running', 'RollingBack');

-- A tenant being restored from a snapshot.
ALTER TABLE tenants DROP CONSTRAINT tenants_phase_check;
ALTER TABLE tenants ADD CONSTRAINT tenants_phase_check
    CHECK (phase IN ('Pending', 'Provisioning', 'Ready', 'Upgrading', 'Restoring', 'Deleting', 'Failed', 'Deleted'));
