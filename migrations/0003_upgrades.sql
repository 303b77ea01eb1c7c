-- Upgrades of tenant control planes (docs/upgrades.md). One row per upgrade a tenant went
-- through or is going through; `tenants.version` is always the version the control plane
-- should run right now (the current hop's end while Running, its start while RollingBack),
-- so a reconcile pass renders the right images from the tenant row alone.
CREATE TABLE tenant_upgrades (
    id BIGSERIAL PRIMARY KEY,
    tenant_id BIGINT NOT NULL REFERENCES tenants (id),
    -- Where the tenant started and where it should end (minors, e.g. '1.35' and '1.37').
    from_version TEXT NOT NULL,
    target_version TEXT NOT NULL,
    -- Go through the minors between, one hop each (asked for by the request).
    chain BOOLEAN NOT NULL,
    -- The hop in progress: its start is where a rollback returns to.
    hop_from TEXT NOT NULL,
    hop_to TEXT NOT NULL,
    hop_started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    state TEXT NOT NULL CHECK (state IN ('Running', 'RollingBack', 'Succeeded', 'RolledBack')),
    -- Why it was rolled back (a failed gate, for people).
    reason TEXT,
    requested_by TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at TIMESTAMPTZ
);

-- At most one upgrade moves a tenant at a time.
CREATE UNIQUE INDEX tenant_upgrades_one_active ON tenant_upgrades (tenant_id)
    WHERE state IN ('Running', 'RollingBack');
CREATE INDEX tenant_upgrades_by_tenant ON tenant_upgrades (tenant_id, id DESC);
