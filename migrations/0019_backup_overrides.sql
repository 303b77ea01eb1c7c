-- Per-tenant backup schedules (issue 29; docs/orchestrator.md, "Backups"): a tenant's own
-- `{"hourly": N, "daily": M}` in place of its plan's `backups`; NULL: the plan's. Set through
-- `PATCH /v1/tenants/{name}` (`backups`). Forward-only; never edit once landed.
ALTER TABLE tenants ADD COLUMN backups JSONB;
