-- Sleeping tenants (docs/orchestrator.md, "Sleeping tenants"): a control plane scaled to zero
-- while nobody uses it. `sleep` is what was asked, as `desired` is for existence: 'awake' (run
-- it) or 'asleep' (scale it to zero until a wake); the phase 'Sleeping' says it is down.
-- `active_at` is the last time the gateway reported a connection for the tenant: where its
-- plan's idle clock starts (NULL: never seen; the clock starts at the tenant's creation).
-- Forward-only; never edit once landed.
ALTER TABLE tenants ADD COLUMN sleep TEXT NOT NULL DEFAULT 'awake'
    CHECK (sleep IN ('awake', 'asleep'));
ALTER TABLE tenants ADD COLUMN active_at TIMESTAMPTZ;
ALTER TABLE tenants DROP CONSTRAINT tenants_phase_check;
ALTER TABLE tenants ADD CONSTRAINT tenants_phase_check
    CHECK (phase IN ('Pending', 'Provisioning', 'Ready', 'Upgrading', 'Restoring', 'Sleeping',
                     'Deleting', 'Failed', 'Deleted'));
-- The gateway's token: it may report activity and ask for wakes, nothing else.
ALTER TABLE api_tokens DROP CONSTRAINT api_tokens_role_check;
ALTER TABLE api_tokens ADD CONSTRAINT api_tokens_role_check
    CHECK (role IN ('admin', 'owner', 'gateway'));
