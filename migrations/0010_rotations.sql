-- Rotations of a tenant's CAs and service-account key (issue 15). The provisioner walks each
-- through its phases (trust, sign, serve, retire, done; see orchestrator/src/pki/rotation.rs)
-- and records every step here; the host Secrets hold the key material. One rotation at a time
-- per tenant: two interleaved ones would each retire what the other still signs with.
CREATE TABLE rotations (
    id              BIGSERIAL PRIMARY KEY,
    tenant_id       BIGINT NOT NULL REFERENCES tenants (id),
    target          TEXT NOT NULL
                    CHECK (target IN ('ca', 'etcd-ca', 'front-proxy-ca', 'service-account-key')),
    phase           TEXT NOT NULL CHECK (phase IN ('trust', 'sign', 'serve', 'retire', 'done')),
    -- How long `sign` lasts at least.
    overlap_seconds BIGINT NOT NULL CHECK (overlap_seconds >= 0),
    requested_by    TEXT NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    phase_since     TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- When `sign` began: a `ca` rotation's kubeconfigs issued before it hold only the old CA
    -- and must be reissued before `serve`.
    signing_since   TIMESTAMPTZ,
    finished_at     TIMESTAMPTZ
);
CREATE UNIQUE INDEX rotations_one_active ON rotations (tenant_id) WHERE finished_at IS NULL;
CREATE INDEX rotations_tenant ON rotations (tenant_id, id);
