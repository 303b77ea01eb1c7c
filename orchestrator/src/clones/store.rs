//! Clones in the inventory (`migrations/0018_clones.sql`): the clone created with its copy of
//! the source's snapshot and the source's key in one transaction (so no clone ever exists
//! without what it restores from), the restore of that copy started once, and whether the
//! clone is due a key of its own.

use crate::inventory::{Inventory, NewTenant, TENANT_COLUMNS, Tenant, audit_in, commit_work};
use crate::pki::seal::{InventoryKey, associated_data};
use crate::render::encryption::DataKey;
use crate::snapshots::store::{RESTORE_COLUMNS, RestoreRow, SnapshotRow};
use crate::{Error, Result};
use vcp_core::lifecycle::RestoreState;

/// What a clone starts from: the source (live or deleted), its uploaded snapshot, and the
/// encryption key that snapshot's values were written with (none for a snapshot from before
/// the source had one).
#[derive(Debug, Clone)]
pub struct Seed {
    pub source: Tenant,
    pub snapshot: SnapshotRow,
    pub key: Option<DataKey>,
}

impl Inventory {
    /// A tenant by its key, live or deleted (keys are never reused), only `owner`'s when given.
    pub async fn tenant_keyed(&self, key: &str, owner: Option<&str>) -> Result<Option<Tenant>> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {TENANT_COLUMNS} FROM tenants
             WHERE key = $1 AND ($2::text IS NULL OR owner = $2)"
        )))
        .bind(key)
        .bind(owner)
        .fetch_optional(self.pool())
        .await?)
    }

    /// Creates a clone of `seed`: the tenant, its snapshot 1 (a copy of the seed's row: the same
    /// object, SHA-256 and backup key, no schedule, so the clone's retention never deletes the
    /// source's object), and the seed's key sealed as the clone's first key under the same name
    /// (the restored values carry it in their prefix). Errors as
    /// [`Inventory::create_tenant`]'s.
    pub async fn create_clone(
        &self,
        t: &NewTenant,
        seed: &Seed,
        kek: &InventoryKey,
        actor: &str,
    ) -> Result<Tenant> {
        let mut tx = self.pool().begin().await?;
        let row = crate::inventory::insert_tenant(&mut tx, t).await?;
        let copy: i64 = sqlx::query_scalar(
            "WITH n AS (UPDATE tenants SET snapshot_numbers = snapshot_numbers + 1 WHERE id = $1
                        RETURNING snapshot_numbers)
             INSERT INTO etcd_snapshots (tenant_id, number, version, state, revision, size_bytes,
               sha256, storage_version, location, requested_by, finished_at, backup_key_id,
               copied_from)
             SELECT $1, n.snapshot_numbers, s.version, s.state, s.revision, s.size_bytes,
               s.sha256, s.storage_version, s.location, $3, s.finished_at, s.backup_key_id, s.id
             FROM etcd_snapshots s, n WHERE s.id = $2
             RETURNING id",
        )
        .bind(row.id)
        .bind(seed.snapshot.id)
        .bind(actor)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| Error::Backup(format!("snapshot {} is gone", seed.snapshot.id)))?;
        let row: Tenant = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "UPDATE tenants SET seed_snapshot_id = $2 WHERE id = $1 RETURNING {TENANT_COLUMNS}"
        )))
        .bind(row.id)
        .bind(copy)
        .fetch_one(&mut *tx)
        .await?;
        if let Some(k) = &seed.key {
            let sealed = kek.seal(&k.secret, &associated_data(row.id, &k.name));
            sqlx::query(
                "INSERT INTO encryption_keys (tenant_id, name, kek_id, nonce, ciphertext)
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(row.id)
            .bind(&k.name)
            .bind(&sealed.key_id)
            .bind(&sealed.nonce)
            .bind(&sealed.ciphertext)
            .execute(&mut *tx)
            .await?;
            audit_in(
                &mut tx,
                actor,
                "tenant.encryption-key.create",
                Some(row.id),
                serde_json::json!({"name": k.name, "copied_from": seed.source.key,
                    "inventory_key": sealed.key_id}),
            )
            .await?;
        }
        let mut details = crate::inventory::creation(t);
        details["from_snapshot"] = serde_json::json!({"tenant": seed.source.key,
            "owner": seed.source.owner, "snapshot": seed.snapshot.number});
        commit_work(tx, actor, "tenant.create", Some(row.id), details).await?;
        Ok(row)
    }

    /// Starts the restore of a clone's seed, once: `None` when it was started before (whatever
    /// became of it) or another restore runs.
    pub async fn start_seed_restore(&self, t: &Tenant, actor: &str) -> Result<Option<RestoreRow>> {
        let Some(seed) = t.seed_snapshot_id else {
            return Ok(None);
        };
        let mut tx = self.pool().begin().await?;
        // The tenant's row lock orders two replicas' passes: the second sees the first's row.
        sqlx::query("SELECT id FROM tenants WHERE id = $1 FOR UPDATE")
            .bind(t.id)
            .execute(&mut *tx)
            .await?;
        let row: Option<RestoreRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "INSERT INTO etcd_restores (tenant_id, snapshot_id, state, requested_by)
             SELECT $1, $2, $3, $4
             WHERE NOT EXISTS (SELECT 1 FROM etcd_restores
                               WHERE tenant_id = $1 AND (snapshot_id = $2 OR state = $3))
             RETURNING {RESTORE_COLUMNS}"
        )))
        .bind(t.id)
        .bind(seed)
        .bind(RestoreState::Running)
        .bind(actor)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(r) = &row {
            audit_in(
                &mut tx,
                actor,
                "tenant.restore.start",
                Some(t.id),
                serde_json::json!({"restore": r.id, "snapshot": r.snapshot_number, "seed": true}),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(row)
    }

    /// Whether a clone still shares its source's key: its seed restored, and no encryption-key
    /// rotation of its own yet.
    pub async fn own_key_due(&self, t: &Tenant) -> Result<bool> {
        let Some(seed) = t.seed_snapshot_id else {
            return Ok(false);
        };
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM etcd_restores
                            WHERE tenant_id = $1 AND snapshot_id = $2 AND state = $3)
               AND NOT EXISTS (SELECT 1 FROM rotations
                               WHERE tenant_id = $1 AND target = 'encryption-key')",
        )
        .bind(t.id)
        .bind(seed)
        .bind(RestoreState::Succeeded)
        .fetch_one(self.pool())
        .await?)
    }
}
