-- Backups off the host cluster (issue 29; docs/orchestrator.md, "Backups"). Each snapshot, once
-- taken, is sealed with a backup key of its tenant and uploaded to the platform's S3-compatible
-- store; its location becomes `s3://<bucket>/<key>`. Forward-only; never edit once landed.
--
-- A tenant's backup keys (32 random bytes each), sealed with the inventory key as its etcd
-- encryption keys are (orchestrator/src/pki/seal.rs), but apart from them: the encryption keys
-- are retired by their rotations, while a backup must open for as long as it is kept, deleted
-- tenants' included. Each backup records which key sealed it.
CREATE TABLE backup_keys (
    id           BIGSERIAL PRIMARY KEY,
    tenant_id    BIGINT NOT NULL REFERENCES tenants (id),
    kek_id       TEXT NOT NULL,
    nonce        BYTEA NOT NULL,
    ciphertext   BYTEA NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- No new backup is sealed with a retired key; the backups it sealed still open with it.
    retired_at   TIMESTAMPTZ
);
-- One key seals a tenant's new backups: two replicas racing to make it insert one row.
CREATE UNIQUE INDEX backup_keys_one_live ON backup_keys (tenant_id) WHERE retired_at IS NULL;

ALTER TABLE etcd_snapshots
    -- The backup key that sealed the uploaded copy; NULL for a snapshot kept on its claim only.
    ADD COLUMN backup_key_id BIGINT REFERENCES backup_keys (id),
    -- The plan's schedule that asked for it, and the start of the hour or day it stands for;
    -- NULL for a snapshot asked for through the API or by an upgrade (never expired).
    ADD COLUMN schedule TEXT CHECK (schedule IN ('hourly', 'daily')),
    ADD COLUMN scheduled_for TIMESTAMPTZ,
    -- When retention deleted its object (the row stays, for the audit trail).
    ADD COLUMN pruned_at TIMESTAMPTZ,
    ADD CHECK ((schedule IS NULL) = (scheduled_for IS NULL));
-- One snapshot per schedule and period: replicas asking for the same one insert one row.
CREATE UNIQUE INDEX etcd_snapshots_one_per_slot ON etcd_snapshots (tenant_id, schedule, scheduled_for)
    WHERE schedule IS NOT NULL;
