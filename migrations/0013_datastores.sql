-- Shared datastores (docs/orchestrator.md, "Shared datastores"): etcd clusters vcp runs for
-- many tenants, each tenant under its own key prefix and etcd user.

-- One row per datastore vcp has reconciled; `--datastores` declares them.
CREATE TABLE datastores (
    name        TEXT PRIMARY KEY,
    phase       TEXT NOT NULL DEFAULT 'Pending' CHECK (phase IN ('Pending', 'Ready', 'Failed')),
    -- What it waits for, or why it failed; empty when Ready.
    message     TEXT NOT NULL DEFAULT '',
    members     INT NOT NULL CHECK (members IN (1, 3)),
    -- When authentication was first found on (the root user and role in place).
    ready_at    TIMESTAMPTZ,
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Tenants whose etcd user a datastore holds: the grant Job succeeded. A tenant's data lives on
-- that datastore from then on; without a row, in its own etcd.
CREATE TABLE datastore_tenants (
    tenant_id   BIGINT PRIMARY KEY REFERENCES tenants (id),
    datastore   TEXT NOT NULL REFERENCES datastores (name),
    granted_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX datastore_tenants_by_store ON datastore_tenants (datastore);
