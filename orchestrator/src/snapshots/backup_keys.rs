//! Tenants' backup keys in the inventory (`migrations/0016_backups.sql`): 32 random bytes per
//! tenant, sealed with the inventory key, made the first time a snapshot of the tenant is
//! uploaded (a unique index settles replicas racing to make it) and kept as long as any backup
//! it sealed, after the tenant is deleted too.
//!
//! Why a key of its own rather than the tenant's etcd encryption key: that key is rotated
//! (`encryption-key` rotations retire it once the store is rewritten), its bytes sit in the
//! apiserver's configuration, and a backup must open years later without either. A backup
//! names the key that sealed it (its row's `backup_key_id`, and the id in its header), so a
//! key made later never makes an older backup unreadable.

use crate::inventory::{Inventory, audit_in};
use crate::pki::seal::{InventoryKey, Sealed, associated_data};
use crate::snapshots::sealed::KEY_LEN;
use crate::{Error, Result};

/// The name a backup key is sealed under (the associated data binds it to the tenant and this
/// name, so an etcd encryption key's row cannot stand in for it, nor the other way round).
const SEALED_NAME: &str = "backup";

#[derive(Debug, Clone, sqlx::FromRow)]
struct KeyRow {
    id: i64,
    tenant_id: i64,
    kek_id: String,
    nonce: Vec<u8>,
    ciphertext: Vec<u8>,
}

/// One backup key, opened.
#[derive(Clone)]
pub struct BackupKey {
    pub id: i64,
    pub secret: [u8; KEY_LEN],
}

impl std::fmt::Debug for BackupKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackupKey")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

fn open(kek: &InventoryKey, k: &KeyRow) -> Result<BackupKey> {
    let what = format!("backup key {} of tenant {}", k.id, k.tenant_id);
    let sealed = Sealed {
        key_id: k.kek_id.clone(),
        nonce: k.nonce.clone(),
        ciphertext: k.ciphertext.clone(),
    };
    let bytes = kek.open(&what, &sealed, &associated_data(k.tenant_id, SEALED_NAME))?;
    let secret: [u8; KEY_LEN] = bytes
        .as_slice()
        .try_into()
        .map_err(|_| Error::Backup(format!("{what} is {} bytes, not 32", bytes.len())))?;
    Ok(BackupKey { id: k.id, secret })
}

impl Inventory {
    /// The key that seals the tenant's new backups, made now if it has none.
    pub async fn live_backup_key(
        &self,
        tenant_id: i64,
        kek: &InventoryKey,
        actor: &str,
    ) -> Result<BackupKey> {
        let live = || async {
            sqlx::query_as::<_, KeyRow>(
                "SELECT id, tenant_id, kek_id, nonce, ciphertext FROM backup_keys
                 WHERE tenant_id = $1 AND retired_at IS NULL",
            )
            .bind(tenant_id)
            .fetch_optional(self.pool())
            .await
        };
        if let Some(k) = live().await? {
            return open(kek, &k);
        }
        let mut tx = self.pool().begin().await?;
        let sealed = kek.seal(
            &vcp_pki::random_bytes::<KEY_LEN>(),
            &associated_data(tenant_id, SEALED_NAME),
        );
        let made: Option<i64> = sqlx::query_scalar(
            "INSERT INTO backup_keys (tenant_id, kek_id, nonce, ciphertext)
             VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING id",
        )
        .bind(tenant_id)
        .bind(&sealed.key_id)
        .bind(&sealed.nonce)
        .bind(&sealed.ciphertext)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(id) = made {
            audit_in(
                &mut tx,
                actor,
                "tenant.backup-key.create",
                Some(tenant_id),
                serde_json::json!({"backup_key": id, "inventory_key": sealed.key_id}),
            )
            .await?;
        }
        tx.commit().await?;
        // Ours, or the one another replica made first.
        let k = live()
            .await?
            .ok_or_else(|| Error::Backup("the backup key just made is gone".into()))?;
        open(kek, &k)
    }

    /// Backup key `id` of a tenant (retired or not), opened: the one a backup names. A clone
    /// may also open the key of the source's backup it was made from (its seed), and no other
    /// tenant's.
    pub async fn backup_key(
        &self,
        tenant_id: i64,
        id: i64,
        kek: &InventoryKey,
    ) -> Result<BackupKey> {
        let k: KeyRow = sqlx::query_as(
            "SELECT id, tenant_id, kek_id, nonce, ciphertext FROM backup_keys
             WHERE id = $2 AND (tenant_id = $1 OR id = (
               SELECT s.backup_key_id FROM tenants c JOIN etcd_snapshots s
                 ON s.id = c.seed_snapshot_id WHERE c.id = $1))",
        )
        .bind(tenant_id)
        .bind(id)
        .fetch_optional(self.pool())
        .await?
        .ok_or_else(|| Error::Backup(format!("tenant {tenant_id} has no backup key {id}")))?;
        open(kek, &k)
    }
}
