//! The inventory's part of shared datastores: each datastore's phase as its reconciler last
//! found it, and which tenants hold a user on which datastore.

use crate::Result;
use crate::inventory::Inventory;

/// A datastore's phase, as `datastores.phase` holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorePhase {
    Pending,
    Ready,
    Failed,
}

impl StorePhase {
    fn as_str(self) -> &'static str {
        match self {
            StorePhase::Pending => "Pending",
            StorePhase::Ready => "Ready",
            StorePhase::Failed => "Failed",
        }
    }
}

/// A datastore's row.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct StoreRow {
    pub name: String,
    pub phase: String,
    pub message: String,
    pub members: i32,
}

impl StoreRow {
    pub fn ready(&self) -> bool {
        self.phase == StorePhase::Ready.as_str()
    }
}

impl Inventory {
    /// Records what the reconciler found of datastore `name`.
    pub async fn record_datastore(
        &self,
        name: &str,
        members: u8,
        phase: StorePhase,
        message: &str,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO datastores (name, phase, message, members, ready_at)
             VALUES ($1, $2, $3, $4, CASE WHEN $2 = 'Ready' THEN now() END)
             ON CONFLICT (name) DO UPDATE SET phase = $2, message = $3, members = $4,
                 ready_at = COALESCE(datastores.ready_at, EXCLUDED.ready_at),
                 updated_at = now()
             WHERE (datastores.phase, datastores.message, datastores.members)
                 IS DISTINCT FROM ($2, $3, $4)",
        )
        .bind(name)
        .bind(phase.as_str())
        .bind(message)
        .bind(i32::from(members))
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Datastore `name` as last recorded.
    pub async fn datastore(&self, name: &str) -> Result<Option<StoreRow>> {
        Ok(
            sqlx::query_as("SELECT name, phase, message, members FROM datastores WHERE name = $1")
                .bind(name)
                .fetch_optional(self.pool())
                .await?,
        )
    }

    /// Every datastore a tenant has asked for.
    pub async fn datastore_names(&self) -> Result<Vec<String>> {
        Ok(
            sqlx::query_scalar("SELECT name FROM datastores ORDER BY name")
                .fetch_all(self.pool())
                .await?,
        )
    }

    /// The datastore tenant `tenant_id` holds a user on, if any.
    pub async fn tenant_datastore(&self, tenant_id: i64) -> Result<Option<String>> {
        Ok(
            sqlx::query_scalar("SELECT datastore FROM datastore_tenants WHERE tenant_id = $1")
                .bind(tenant_id)
                .fetch_optional(self.pool())
                .await?,
        )
    }

    /// Records that datastore `name` holds tenant `tenant_id`'s user.
    pub async fn record_grant(&self, tenant_id: i64, name: &str) -> Result<()> {
        sqlx::query(
            "INSERT INTO datastore_tenants (tenant_id, datastore) VALUES ($1, $2)
             ON CONFLICT (tenant_id) DO UPDATE SET datastore = $2, granted_at = now()
             WHERE datastore_tenants.datastore <> $2",
        )
        .bind(tenant_id)
        .bind(name)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Forgets tenant `tenant_id`'s user (revoked).
    pub async fn forget_grant(&self, tenant_id: i64) -> Result<()> {
        sqlx::query("DELETE FROM datastore_tenants WHERE tenant_id = $1")
            .bind(tenant_id)
            .execute(self.pool())
            .await?;
        Ok(())
    }
}
