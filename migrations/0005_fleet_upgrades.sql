-- Fleet upgrades (docs/upgrades.md, "Fleet upgrades"): an admin moves many tenants to a new
-- minor in waves. A fleet upgrade only decides which tenant starts when; each tenant's own
-- upgrade is a `tenant_upgrades` row like any other, rolled by the reconcile workers.
-- Forward-only; never edit once landed.

-- What a tenant says about fleet upgrades: when they may move it (a maintenance window,
-- JSON `{"days": ["sat"], "start": "02:00", "duration_minutes": 240}`, UTC; NULL: the plan's
-- window, or any time) and whether they may move it at all (an expired version moves it
-- regardless).
ALTER TABLE tenants
    ADD COLUMN maintenance_window JSONB,
    ADD COLUMN fleet_upgrades TEXT NOT NULL DEFAULT 'include'
        CHECK (fleet_upgrades IN ('include', 'exclude'));

CREATE TABLE fleet_upgrades (
    id BIGSERIAL PRIMARY KEY,
    target_version TEXT NOT NULL,
    -- The request's selector as given (labels, names, version), for people.
    selector JSONB NOT NULL DEFAULT '{}',
    chain BOOLEAN NOT NULL,
    canary INTEGER NOT NULL CHECK (canary >= 1),
    max_parallel INTEGER NOT NULL CHECK (max_parallel >= 1),
    failure_budget INTEGER NOT NULL CHECK (failure_budget >= 0),
    soak_seconds INTEGER NOT NULL CHECK (soak_seconds >= 0),
    respect_maintenance_windows BOOLEAN NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('Running', 'Paused', 'Succeeded', 'Failed', 'Cancelled')),
    -- The wave being started; waves are numbered from 0 (the canary).
    current_wave INTEGER NOT NULL DEFAULT 0,
    -- Set while soaking after a wave: the next wave starts no earlier.
    soak_until TIMESTAMPTZ,
    -- Why it stopped (budget exceeded, cancelled by whom), for people.
    reason TEXT,
    created_by TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at TIMESTAMPTZ,
    -- Work claiming, as for tenants: one replica steps a fleet upgrade at a time.
    lease_owner TEXT,
    lease_until TIMESTAMPTZ,
    next_step_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX fleet_upgrades_due ON fleet_upgrades (next_step_at);

-- One row per tenant a fleet upgrade covers, planned when it is created.
CREATE TABLE fleet_upgrade_tenants (
    fleet_id BIGINT NOT NULL REFERENCES fleet_upgrades (id),
    tenant_id BIGINT NOT NULL REFERENCES tenants (id),
    wave INTEGER NOT NULL CHECK (wave >= 0),
    -- Position in the plan (waves are consecutive runs of it).
    ordinal INTEGER NOT NULL,
    from_version TEXT NOT NULL,
    -- Where this tenant goes: the fleet's target, or one minor up for an expired version.
    target_version TEXT NOT NULL,
    chain BOOLEAN NOT NULL,
    -- Why the tenant is in it although no selector chose it (an expired version), for its
    -- owner; NULL when selected.
    forced TEXT,
    state TEXT NOT NULL CHECK (state IN ('Pending', 'Running', 'Succeeded', 'Failed', 'Skipped')),
    -- The tenant's own upgrade, set in the same transaction that starts it: a tenant with an
    -- upgrade id was started once, and is never started again by this fleet upgrade.
    upgrade_id BIGINT UNIQUE REFERENCES tenant_upgrades (id),
    -- Why it failed or was skipped.
    reason TEXT,
    started_at TIMESTAMPTZ,
    finished_at TIMESTAMPTZ,
    PRIMARY KEY (fleet_id, tenant_id)
);
CREATE INDEX fleet_upgrade_tenants_order ON fleet_upgrade_tenants (fleet_id, ordinal);
