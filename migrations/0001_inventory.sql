-- The orchestrator's inventory: tenants, the versions they run, what was issued for them,
-- who may call the API, and what changed. Forward-only; never edit once landed.

CREATE TABLE versions (
    minor       TEXT PRIMARY KEY,            -- "1.37"
    kubernetes  TEXT NOT NULL,               -- "v1.37.1"
    images      JSONB NOT NULL,              -- component -> image
    is_default  BOOLEAN NOT NULL DEFAULT FALSE,
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE tenants (
    id                  BIGSERIAL PRIMARY KEY,
    name                TEXT NOT NULL,
    -- Immutable host key: the name plus a random suffix, so a re-created tenant never meets its
    -- predecessor's leftovers on the host.
    key                 TEXT NOT NULL UNIQUE,
    owner               TEXT NOT NULL,
    labels              JSONB NOT NULL DEFAULT '{}',
    version             TEXT NOT NULL REFERENCES versions (minor),
    plan                TEXT NOT NULL DEFAULT 'default',
    desired             TEXT NOT NULL DEFAULT 'present' CHECK (desired IN ('present', 'absent')),
    retain_data         BOOLEAN NOT NULL DEFAULT FALSE,
    phase               TEXT NOT NULL DEFAULT 'Pending'
                        CHECK (phase IN ('Pending', 'Provisioning', 'Ready', 'Upgrading', 'Deleting', 'Failed', 'Deleted')),
    conditions          JSONB NOT NULL DEFAULT '[]',
    endpoint            TEXT,
    generation          BIGINT NOT NULL DEFAULT 1,
    observed_generation BIGINT NOT NULL DEFAULT 0,
    -- Work claiming: a replica holds a tenant while lease_until is in the future.
    lease_owner         TEXT,
    lease_until         TIMESTAMPTZ,
    next_reconcile_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    created_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    deleted_at          TIMESTAMPTZ
);
-- A name is unique among live tenants; a deleted tenant's name can be reused (with a new key).
CREATE UNIQUE INDEX tenants_live_name ON tenants (name) WHERE deleted_at IS NULL;
CREATE INDEX tenants_due ON tenants (next_reconcile_at) WHERE deleted_at IS NULL;
CREATE INDEX tenants_owner ON tenants (owner) WHERE deleted_at IS NULL;

CREATE TABLE certificates (
    id           BIGSERIAL PRIMARY KEY,
    tenant_id    BIGINT NOT NULL REFERENCES tenants (id),
    purpose      TEXT NOT NULL,              -- "cluster-ca", "apiserver", ...
    serial       TEXT NOT NULL,              -- hex
    fingerprint  TEXT NOT NULL,              -- sha256 of the DER, hex
    subject      TEXT NOT NULL,
    not_before   TIMESTAMPTZ NOT NULL,
    not_after    TIMESTAMPTZ NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, purpose, serial)
);

CREATE TABLE kubeconfigs (
    id           BIGSERIAL PRIMARY KEY,
    tenant_id    BIGINT NOT NULL REFERENCES tenants (id),
    username     TEXT NOT NULL,
    groups       TEXT[] NOT NULL DEFAULT '{}',
    serial       TEXT NOT NULL UNIQUE,
    expires_at   TIMESTAMPTZ NOT NULL,
    created_by   TEXT NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    revoked_at   TIMESTAMPTZ
);

CREATE TABLE api_tokens (
    id          BIGSERIAL PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    role        TEXT NOT NULL CHECK (role IN ('admin', 'owner')),
    -- sha256 of the secret; the secret itself is shown once and never stored.
    hash        BYTEA NOT NULL UNIQUE,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    revoked_at  TIMESTAMPTZ
);

CREATE TABLE audit (
    id         BIGSERIAL PRIMARY KEY,
    at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    actor      TEXT NOT NULL,                -- token name, or "reconciler/<replica>"
    action     TEXT NOT NULL,                -- "tenant.create", "tenant.phase", ...
    tenant_id  BIGINT REFERENCES tenants (id),
    detail     JSONB NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_tenant ON audit (tenant_id, at);
