-- The tenants' audit logs (issue 29; docs/orchestrator.md, "The tenant's audit log"). Each
-- tenant apiserver sends its audit events to vcp's ingest with a token of its own; the
-- inventory keeps only the token's SHA-256, as for API tokens, and the ingest knows the tenant
-- from the token alone (never from the events). Forward-only; never edit once landed.
CREATE TABLE tenant_audit_tokens (
    tenant_id   BIGINT PRIMARY KEY REFERENCES tenants (id),
    token_hash  BYTEA NOT NULL UNIQUE,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- One row per request: only the stages ResponseComplete and Panic are kept. The columns are
-- what the owner filters and reads by; `event` is the event itself, at most 64 KiB (a larger
-- one is stored without its request and response bodies), never a Secret's body.
CREATE TABLE tenant_audit_events (
    id                  BIGSERIAL PRIMARY KEY,
    tenant_id           BIGINT NOT NULL REFERENCES tenants (id),
    -- The event's requestReceivedTimestamp: what ranges, paging and retention go by.
    at                  TIMESTAMPTZ NOT NULL,
    audit_id            TEXT NOT NULL,
    stage               TEXT NOT NULL CHECK (stage IN ('ResponseComplete', 'Panic')),
    -- Who authenticated, and whom they acted as (impersonation: sudo).
    username            TEXT NOT NULL,
    groups              TEXT[] NOT NULL DEFAULT '{}',
    impersonated_user   TEXT,
    impersonated_groups TEXT[],
    verb                TEXT NOT NULL,
    api_group           TEXT,
    resource            TEXT,
    subresource         TEXT,
    namespace           TEXT,
    name                TEXT,
    request_uri         TEXT NOT NULL,
    response_code       INTEGER,
    event               JSONB NOT NULL,
    received_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- The webhook retries a batch it could not deliver: a second copy is dropped.
    UNIQUE (tenant_id, audit_id, stage)
);
-- An owner's reads: one tenant, by time, then id (the paging key).
CREATE INDEX tenant_audit_events_by_tenant ON tenant_audit_events (tenant_id, at, id);
-- The retention sweep: events older than a cutoff, whatever their tenant.
CREATE INDEX tenant_audit_events_by_time ON tenant_audit_events (at);
