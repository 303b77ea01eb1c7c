-- Encryption at rest of tenants' etcd (issue 29; docs/orchestrator.md, "Encryption at rest").
-- Each tenant's data keys (32 bytes each, what its apiserver encrypts Secrets with) are the
-- inventory's truth: sealed with the inventory key (`vcp serve --inventory-key`,
-- XChaCha20-Poly1305; see orchestrator/src/pki/seal.rs), with that key's id and the nonce
-- beside the ciphertext, and bound to (tenant id, name) as associated data, so a row moved to
-- another tenant or renamed does not open. The host Secret `encryption-config` is rendered
-- from these rows on every pass. Forward-only; never edit once landed.
CREATE TABLE encryption_keys (
    id           BIGSERIAL PRIMARY KEY,
    tenant_id    BIGINT NOT NULL REFERENCES tenants (id),
    -- `key1`, `key2`, ...: the name in the prefix of every value stored with it
    -- (`k8s:enc:secretbox:v1:<name>:`).
    name         TEXT NOT NULL CHECK (name ~ '^key[1-9][0-9]*$'),
    kek_id       TEXT NOT NULL,
    nonce        BYTEA NOT NULL,
    ciphertext   BYTEA NOT NULL,
    -- The encryption-key rotation that introduced it; NULL for a tenant's first key, made
    -- before its apiserver first ran.
    rotation_id  BIGINT REFERENCES rotations (id),
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- When a rotation dropped it from the apiserver's configuration. Retired keys are kept:
    -- snapshots taken before the rotation hold values only they decrypt.
    retired_at   TIMESTAMPTZ,
    UNIQUE (tenant_id, name)
);
-- One key per rotation: two replicas racing to make it insert one row.
CREATE UNIQUE INDEX encryption_keys_one_per_rotation ON encryption_keys (rotation_id)
    WHERE rotation_id IS NOT NULL;
-- A tenant's first key is made once.
CREATE UNIQUE INDEX encryption_keys_one_first ON encryption_keys (tenant_id)
    WHERE rotation_id IS NULL;
-- The encryption key becomes a rotation target.
ALTER TABLE rotations DROP CONSTRAINT rotations_target_check;
ALTER TABLE rotations ADD CONSTRAINT rotations_target_check
    CHECK (target IN ('ca', 'etcd-ca', 'front-proxy-ca', 'service-account-key', 'encryption-key'));
