-- Tenant quota usage, sampled from the host by `vcp serve` (docs/orchestrator.md, "Usage"):
-- what each tenant held at each sample, against its plan's quota, for billing. Forward-only;
-- never edit once landed.

-- One row per tenant and sample. The resources are the columns of the plan's `quota` (the
-- tenant-wide quota the syncer enforces), in the same units: counts, CPU in millicores,
-- memory and storage in bytes.
--
-- Samples outlive their tenant: a deleted tenant's row stays (soft delete, `deleted_at`), and
-- so do its samples, until `--usage-retention-days` prunes them like everyone's; billing the
-- last days of a deleted tenant needs them. No ON DELETE CASCADE: tenant rows are never
-- deleted, and one deleted by hand must not take its billing record with it silently.
CREATE TABLE usage_samples (
    tenant_id                BIGINT NOT NULL REFERENCES tenants (id),
    sampled_at               TIMESTAMPTZ NOT NULL,
    pods                     BIGINT NOT NULL CHECK (pods >= 0),
    requests_cpu             BIGINT NOT NULL CHECK (requests_cpu >= 0),     -- millicores
    requests_memory          BIGINT NOT NULL CHECK (requests_memory >= 0),  -- bytes
    limits_cpu               BIGINT NOT NULL CHECK (limits_cpu >= 0),       -- millicores
    limits_memory            BIGINT NOT NULL CHECK (limits_memory >= 0),    -- bytes
    services                 BIGINT NOT NULL CHECK (services >= 0),
    persistent_volume_claims BIGINT NOT NULL CHECK (persistent_volume_claims >= 0),
    requests_storage         BIGINT NOT NULL CHECK (requests_storage >= 0), -- bytes
    namespaces               BIGINT NOT NULL CHECK (namespaces >= 0),
    -- Serves "the latest sample of a tenant" (a backward scan) and "a tenant's samples in a
    -- time range" (a range scan), and keeps one sample per tenant and instant.
    PRIMARY KEY (tenant_id, sampled_at)
);
-- Retention prunes by age across all tenants.
CREATE INDEX usage_samples_age ON usage_samples (sampled_at);
