//! A tenant's etcd encryption keys in the inventory (`migrations/0014_encryption_keys.sql`):
//! sealed with the inventory key, made once per tenant and once per encryption-key rotation
//! (unique indexes settle replicas racing to make one), retired when a rotation drops them and
//! kept after that. Each creation and retirement is audited.

use crate::Result;
use crate::inventory::{Inventory, audit_in};
use crate::pki::seal::{InventoryKey, Sealed, associated_data};
use time::OffsetDateTime;

/// One key, as stored.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct KeyRow {
    pub id: i64,
    pub tenant_id: i64,
    pub name: String,
    pub kek_id: String,
    pub nonce: Vec<u8>,
    pub ciphertext: Vec<u8>,
    pub rotation_id: Option<i64>,
    pub created_at: OffsetDateTime,
    pub retired_at: Option<OffsetDateTime>,
}

impl KeyRow {
    pub fn sealed(&self) -> Sealed {
        Sealed {
            key_id: self.kek_id.clone(),
            nonce: self.nonce.clone(),
            ciphertext: self.ciphertext.clone(),
        }
    }
}

impl Inventory {
    /// A tenant's keys the apiserver still uses, oldest first.
    pub async fn live_encryption_keys(&self, tenant_id: i64) -> Result<Vec<KeyRow>> {
        Ok(sqlx::query_as(
            "SELECT * FROM encryption_keys WHERE tenant_id = $1 AND retired_at IS NULL ORDER BY id",
        )
        .bind(tenant_id)
        .fetch_all(self.pool())
        .await?)
    }

    /// The ids of the inventory keys that sealed any tenant's key: a replica whose inventory
    /// key is not among them cannot open those keys, and refuses to start.
    pub async fn encryption_kek_ids(&self) -> Result<Vec<String>> {
        Ok(
            // Backup keys too (snapshots/backup_keys.rs): sealed with the same key.
            sqlx::query_scalar(
                "SELECT kek_id FROM encryption_keys UNION SELECT kek_id FROM backup_keys
                 ORDER BY kek_id",
            )
            .fetch_all(self.pool())
            .await?,
        )
    }

    /// Every key of a tenant, retired ones too, oldest first.
    pub async fn encryption_keys(&self, tenant_id: i64) -> Result<Vec<KeyRow>> {
        Ok(
            sqlx::query_as("SELECT * FROM encryption_keys WHERE tenant_id = $1 ORDER BY id")
                .bind(tenant_id)
                .fetch_all(self.pool())
                .await?,
        )
    }

    /// Makes the tenant's next key (`key<n>`, n one more than the keys it ever had) from
    /// `secret`, sealed with `kek`: its first (`rotation: None`) or the one rotation
    /// `rotation` introduces. Nothing is written if that key exists already (another replica
    /// made it first); whether this call made it.
    pub async fn add_encryption_key(
        &self,
        tenant_id: i64,
        rotation: Option<i64>,
        secret: &[u8; 32],
        kek: &InventoryKey,
        actor: &str,
    ) -> Result<bool> {
        let mut tx = self.pool().begin().await?;
        // Serializes makers of this tenant's keys, so two never pick one name.
        sqlx::query("SELECT id FROM tenants WHERE id = $1 FOR UPDATE")
            .bind(tenant_id)
            .execute(&mut *tx)
            .await?;
        let had: i64 =
            sqlx::query_scalar("SELECT count(*) FROM encryption_keys WHERE tenant_id = $1")
                .bind(tenant_id)
                .fetch_one(&mut *tx)
                .await?;
        let name = format!("key{}", had + 1);
        let sealed = kek.seal(secret, &associated_data(tenant_id, &name));
        let made = sqlx::query(
            "INSERT INTO encryption_keys (tenant_id, name, kek_id, nonce, ciphertext, rotation_id)
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
        )
        .bind(tenant_id)
        .bind(&name)
        .bind(&sealed.key_id)
        .bind(&sealed.nonce)
        .bind(&sealed.ciphertext)
        .bind(rotation)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if made {
            audit_in(
                &mut tx,
                actor,
                "tenant.encryption-key.create",
                Some(tenant_id),
                serde_json::json!({"name": name, "rotation": rotation, "inventory_key": sealed.key_id}),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(made)
    }

    /// Retires the tenant's live keys other than the one rotation `rotation` introduced (the
    /// rotation's `retire` phase); the number retired (0 when another replica did it first).
    pub async fn retire_encryption_keys(
        &self,
        tenant_id: i64,
        rotation: i64,
        actor: &str,
        now: OffsetDateTime,
    ) -> Result<u64> {
        let mut tx = self.pool().begin().await?;
        let names: Vec<String> = sqlx::query_scalar(
            "UPDATE encryption_keys SET retired_at = $3
             WHERE tenant_id = $1 AND retired_at IS NULL AND rotation_id IS DISTINCT FROM $2
             RETURNING name",
        )
        .bind(tenant_id)
        .bind(rotation)
        .bind(now)
        .fetch_all(&mut *tx)
        .await?;
        if !names.is_empty() {
            audit_in(
                &mut tx,
                actor,
                "tenant.encryption-key.retire",
                Some(tenant_id),
                serde_json::json!({"names": names, "rotation": rotation}),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(names.len() as u64)
    }
}
