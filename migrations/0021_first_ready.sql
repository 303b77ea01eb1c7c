-- When each tenant was first Ready (docs/orchestrator.md, "HTTP API"): a tenant
-- that has been Ready once has its CA and endpoint for good, so its owner's kubeconfigs are
-- issued in any later phase but Deleting, however a later pass finds its control plane.
-- Existing tenants take the first `tenant.phase` audit event that made them Ready, or, with
-- none, their last update if they are in a phase only a Ready tenant reaches.
-- Forward-only; never edit once landed.
ALTER TABLE tenants ADD COLUMN first_ready_at TIMESTAMPTZ;

UPDATE tenants t SET first_ready_at = COALESCE(
    (SELECT min(a.at) FROM audit a
      WHERE a.tenant_id = t.id AND a.action = 'tenant.phase' AND a.detail->>'to' = 'Ready'),
    CASE WHEN t.phase IN ('Ready', 'Upgrading', 'Sleeping', 'Restoring') THEN t.updated_at END);
