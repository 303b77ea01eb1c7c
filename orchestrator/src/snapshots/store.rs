//! etcd snapshots and restores in the inventory (`migrations/0004_snapshots.sql`): asked for
//! by the API or by an upgrade before each hop, recorded by the tenant's reconcile pass with
//! what the snapshot Job reported; restores started by admins and advanced by the pass. The
//! writes an upgrade makes here (the snapshot before a hop, the restore of a rollback) are
//! [`crate::upgrades::store`]'s, in its transactions.

use crate::inventory::{Inventory, Tenant, audit_in, commit_work, due_if_present, notify};
use crate::snapshots::Report;
use crate::{Result, snapshots};
use time::OffsetDateTime;
use vcp_core::lifecycle::{Desired, Phase, RestoreState, SnapshotState};
use vcp_core::naming::control_plane_namespace;

/// A tenant's own backup schedule, as stored (`tenants.backups`).
pub type OwnSchedule = sqlx::types::Json<crate::backup_store::BackupPlan>;

/// One snapshot, as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SnapshotRow {
    /// The row's key, which restores and upgrades refer to; never shown.
    pub id: i64,
    pub tenant_id: i64,
    /// Its number among the tenant's snapshots: what the API, the audit trail and the file
    /// name show (`migrations/0011_snapshot_numbers.sql`).
    pub number: i64,
    pub upgrade_id: Option<i64>,
    pub version: String,
    pub state: SnapshotState,
    pub reason: Option<String>,
    pub revision: Option<i64>,
    pub size_bytes: Option<i64>,
    pub sha256: Option<String>,
    pub storage_version: Option<String>,
    pub location: String,
    pub requested_by: String,
    pub created_at: OffsetDateTime,
    pub finished_at: Option<OffsetDateTime>,
    /// The backup key that sealed its uploaded copy (`migrations/0016_backups.sql`).
    pub backup_key_id: Option<i64>,
    /// The schedule that asked for it, if one did.
    pub schedule: Option<crate::snapshots::schedule::Schedule>,
    /// When retention deleted its uploaded copy.
    pub pruned_at: Option<OffsetDateTime>,
}

/// One restore, as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct RestoreRow {
    pub id: i64,
    pub tenant_id: i64,
    pub snapshot_id: i64,
    /// The [`SnapshotRow::number`] of that snapshot.
    pub snapshot_number: i64,
    pub state: RestoreState,
    pub restored: bool,
    pub reason: Option<String>,
    pub requested_by: String,
    pub created_at: OffsetDateTime,
    pub finished_at: Option<OffsetDateTime>,
    /// A plan change that moves the tenant's data: the plan it leaves and the one it goes to
    /// (migration 0017); both `None` for a plain restore.
    pub from_plan: Option<String>,
    pub to_plan: Option<String>,
}

impl RestoreRow {
    /// The plan a move goes to, if this restore is one.
    pub fn moving_to(&self) -> Option<&str> {
        self.to_plan.as_deref()
    }
}

/// What a pass means for a restore, written with its outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NewRestore {
    /// Every member's data is the snapshot's now; the control plane only starts again.
    Restored,
    Succeeded,
    Failed(String),
}

pub(crate) async fn insert(
    tx: &mut sqlx::PgConnection,
    t: &Tenant,
    upgrade: Option<i64>,
    actor: &str,
) -> Result<SnapshotRow> {
    // Every caller holds the tenant's row lock already (it moved the tenant in this
    // transaction), so two snapshots of one tenant never get one number.
    let number: i64 = sqlx::query_scalar(
        "UPDATE tenants SET snapshot_numbers = snapshot_numbers + 1 WHERE id = $1
         RETURNING snapshot_numbers",
    )
    .bind(t.id)
    .fetch_one(&mut *tx)
    .await?;
    let row: SnapshotRow = sqlx::query_as(
        "INSERT INTO etcd_snapshots
           (tenant_id, number, upgrade_id, version, state, location, requested_by)
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING *",
    )
    .bind(t.id)
    .bind(number)
    .bind(upgrade)
    .bind(&t.version)
    .bind(SnapshotState::Pending)
    .bind(snapshots::location(
        &control_plane_namespace(&t.key),
        number,
    ))
    .bind(actor)
    .fetch_one(&mut *tx)
    .await?;
    audit_in(
        tx,
        actor,
        "tenant.snapshot.request",
        Some(t.id),
        serde_json::json!({"snapshot": row.number, "upgrade": upgrade}),
    )
    .await?;
    Ok(row)
}

/// The columns of a [`RestoreRow`], for `SELECT` and `RETURNING` on `etcd_restores`.
pub(crate) const RESTORE_COLUMNS: &str = "*, (SELECT number FROM etcd_snapshots s
    WHERE s.id = etcd_restores.snapshot_id) AS snapshot_number";

impl Inventory {
    /// Asks for a snapshot of a live, present tenant (one the API found for the caller) and
    /// wakes the workers; `None` if it is gone or being deleted meanwhile. By id, not by name:
    /// an admin's name may match several owners' tenants.
    pub async fn request_snapshot(&self, t: &Tenant, actor: &str) -> Result<Option<SnapshotRow>> {
        let mut tx = self.pool().begin().await?;
        let Some(t) = due_if_present(&mut tx, t.id).await? else {
            return Ok(None);
        };
        let row = insert(&mut tx, &t, None, actor).await?;
        notify(&mut tx).await?;
        tx.commit().await?;
        Ok(Some(row))
    }

    /// A tenant's snapshots, newest first.
    pub async fn snapshots(&self, tenant_id: i64) -> Result<Vec<SnapshotRow>> {
        Ok(
            sqlx::query_as("SELECT * FROM etcd_snapshots WHERE tenant_id = $1 ORDER BY id DESC")
                .bind(tenant_id)
                .fetch_all(self.pool())
                .await?,
        )
    }

    /// One snapshot of a tenant, by its number (as the API names it).
    pub async fn numbered_snapshot(
        &self,
        tenant_id: i64,
        number: i64,
    ) -> Result<Option<SnapshotRow>> {
        Ok(
            sqlx::query_as("SELECT * FROM etcd_snapshots WHERE tenant_id = $1 AND number = $2")
                .bind(tenant_id)
                .bind(number)
                .fetch_optional(self.pool())
                .await?,
        )
    }

    /// One snapshot of a tenant, by its row id (as restores and upgrades refer to it).
    pub async fn snapshot(&self, tenant_id: i64, id: i64) -> Result<Option<SnapshotRow>> {
        Ok(
            sqlx::query_as("SELECT * FROM etcd_snapshots WHERE tenant_id = $1 AND id = $2")
                .bind(tenant_id)
                .bind(id)
                .fetch_optional(self.pool())
                .await?,
        )
    }

    /// The snapshots of a tenant still to take, oldest first.
    pub async fn pending_snapshots(&self, tenant_id: i64) -> Result<Vec<SnapshotRow>> {
        Ok(sqlx::query_as(
            "SELECT * FROM etcd_snapshots WHERE tenant_id = $1 AND state = 'Pending' ORDER BY id",
        )
        .bind(tenant_id)
        .fetch_all(self.pool())
        .await?)
    }

    /// Records how a snapshot ended (once: a snapshot already finished stays as it is).
    pub async fn finish_snapshot(
        &self,
        tenant_id: i64,
        id: i64,
        result: Result<&Report, &str>,
        actor: &str,
    ) -> Result<()> {
        let mut tx = self.pool().begin().await?;
        let (state, reason, r) = match result {
            Ok(r) => (SnapshotState::Succeeded, None, Some(r)),
            Err(why) => (SnapshotState::Failed, Some(why), None),
        };
        // An uploaded snapshot lives where its object is (the claim keeps a copy).
        let done: Option<(i64, String)> = sqlx::query_as(
            "UPDATE etcd_snapshots SET state = $3, reason = $4, revision = $5, size_bytes = $6,
               sha256 = $7, storage_version = $8, finished_at = now(),
               location = COALESCE($9, location), backup_key_id = $10
             WHERE tenant_id = $1 AND id = $2 AND state = 'Pending'
             RETURNING number, location",
        )
        .bind(tenant_id)
        .bind(id)
        .bind(state)
        .bind(reason)
        .bind(r.map(|r| r.revision))
        .bind(r.map(|r| r.size))
        .bind(r.map(|r| r.sha256.as_str()))
        .bind(r.map(|r| r.storage_version.as_str()))
        .bind(r.and_then(|r| r.object.as_deref()))
        .bind(r.and_then(|r| r.backup_key))
        .fetch_optional(&mut *tx)
        .await?;
        // A logical snapshot's file is named as one (the kind is known once it is taken).
        if let (Some((_, location)), Some(r)) = (&done, r)
            && snapshots::is_logical(&r.storage_version)
            && r.object.is_none()
        {
            sqlx::query("UPDATE etcd_snapshots SET location = $2 WHERE id = $1")
                .bind(id)
                .bind(snapshots::logical_location(location))
                .execute(&mut *tx)
                .await?;
        }
        if let Some((number, _)) = done {
            audit_in(
                &mut tx,
                actor,
                "tenant.snapshot.finished",
                Some(tenant_id),
                serde_json::json!({"snapshot": number, "state": state, "reason": reason,
                    "revision": r.map(|r| r.revision), "sha256": r.map(|r| &r.sha256),
                    "object": r.and_then(|r| r.object.as_ref())}),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Live tenants with their plan, whether they are Ready (present and serving) and their
    /// own schedule: those the backup sweep looks at ([`crate::snapshots::schedule`]).
    pub async fn backup_tenants(&self) -> Result<Vec<(i64, String, bool, Option<OwnSchedule>)>> {
        Ok(sqlx::query_as(
            "SELECT id, plan, desired = $1 AND phase = $2, backups FROM tenants
             WHERE deleted_at IS NULL ORDER BY id",
        )
        .bind(Desired::Present)
        .bind(Phase::Ready)
        .fetch_all(self.pool())
        .await?)
    }

    /// Deleted tenants with scheduled snapshots retention has not pruned, with their plan and
    /// own schedule:
    /// those the backup sweep prunes once their retention has passed.
    pub async fn deleted_backup_tenants(&self) -> Result<Vec<(i64, String, Option<OwnSchedule>)>> {
        Ok(sqlx::query_as(
            "SELECT t.id, t.plan, t.backups FROM tenants t
             WHERE t.deleted_at IS NOT NULL AND EXISTS (SELECT 1 FROM etcd_snapshots s
               WHERE s.tenant_id = t.id AND s.schedule IS NOT NULL AND s.pruned_at IS NULL)
             ORDER BY t.id",
        )
        .fetch_all(self.pool())
        .await?)
    }

    /// A tenant's scheduled snapshots whose copies retention has not pruned.
    pub async fn scheduled_snapshots(
        &self,
        tenant_id: i64,
    ) -> Result<Vec<crate::snapshots::schedule::Scheduled>> {
        Ok(sqlx::query_as(
            "SELECT id, schedule, scheduled_for, state, location FROM etcd_snapshots
             WHERE tenant_id = $1 AND schedule IS NOT NULL AND pruned_at IS NULL",
        )
        .bind(tenant_id)
        .fetch_all(self.pool())
        .await?)
    }

    /// Asks for the snapshot of `schedule` for `period` unless the tenant has it already (or
    /// is gone): its number, when this call asked for it.
    pub async fn request_scheduled_snapshot(
        &self,
        tenant_id: i64,
        schedule: crate::snapshots::schedule::Schedule,
        period: OffsetDateTime,
        actor: &str,
    ) -> Result<Option<i64>> {
        let mut tx = self.pool().begin().await?;
        // The tenant's row lock (taken by due_if_present's UPDATE) orders the replicas asking
        // for one period: the second sees the first's row.
        let Some(t) = due_if_present(&mut tx, tenant_id).await? else {
            return Ok(None);
        };
        let had: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM etcd_snapshots
               WHERE tenant_id = $1 AND schedule = $2 AND scheduled_for = $3)",
        )
        .bind(tenant_id)
        .bind(schedule)
        .bind(period)
        .fetch_one(&mut *tx)
        .await?;
        if had {
            return Ok(None);
        }
        let row = insert(&mut tx, &t, None, actor).await?;
        sqlx::query("UPDATE etcd_snapshots SET schedule = $2, scheduled_for = $3 WHERE id = $1")
            .bind(row.id)
            .bind(schedule)
            .bind(period)
            .execute(&mut *tx)
            .await?;
        notify(&mut tx).await?;
        tx.commit().await?;
        Ok(Some(row.number))
    }

    /// Records that retention deleted a snapshot's uploaded copy; whether this call did. The
    /// clones' copies of it (same object) are marked pruned with it, each in its clone's audit
    /// trail, so none of them is offered for a restore or a clone that would find no object.
    pub async fn mark_pruned(&self, tenant_id: i64, id: i64, actor: &str) -> Result<bool> {
        let mut tx = self.pool().begin().await?;
        let number: Option<i64> = sqlx::query_scalar(
            "UPDATE etcd_snapshots SET pruned_at = now()
             WHERE tenant_id = $1 AND id = $2 AND pruned_at IS NULL RETURNING number",
        )
        .bind(tenant_id)
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(n) = number {
            audit_in(
                &mut tx,
                actor,
                "tenant.snapshot.pruned",
                Some(tenant_id),
                serde_json::json!({"snapshot": n}),
            )
            .await?;
            let copies: Vec<(i64, i64)> = sqlx::query_as(
                "UPDATE etcd_snapshots SET pruned_at = now()
                 WHERE copied_from = $1 AND pruned_at IS NULL RETURNING tenant_id, number",
            )
            .bind(id)
            .fetch_all(&mut *tx)
            .await?;
            for (clone, copy) in copies {
                audit_in(
                    &mut tx,
                    actor,
                    "tenant.snapshot.pruned",
                    Some(clone),
                    serde_json::json!({"snapshot": copy, "copy_of": {"tenant_id": tenant_id,
                        "snapshot": n}}),
                )
                .await?;
            }
        }
        tx.commit().await?;
        Ok(number.is_some())
    }

    /// Whether a clone has yet to restore from a copy of this snapshot (its seed restore not
    /// started, or running): retention keeps the object until that restore has ended.
    pub async fn seeds_a_clone(&self, id: i64) -> Result<bool> {
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (
               SELECT 1 FROM etcd_snapshots c JOIN tenants t ON t.seed_snapshot_id = c.id
               WHERE c.copied_from = $1 AND t.deleted_at IS NULL AND t.desired = $2
                 AND NOT EXISTS (SELECT 1 FROM etcd_restores r
                                 WHERE r.tenant_id = t.id AND r.snapshot_id = c.id
                                   AND r.state <> $3))",
        )
        .bind(id)
        .bind(Desired::Present)
        .bind(RestoreState::Running)
        .fetch_one(self.pool())
        .await?)
    }

    /// Starts a restore of a Ready tenant from one of its taken snapshots (no upgrade or
    /// other restore running): phase `Restoring`, workers woken. `None` when the tenant is not
    /// Ready or something else moves it (the caller tells which).
    pub async fn start_restore(
        &self,
        t: &Tenant,
        snapshot: &SnapshotRow,
        actor: &str,
    ) -> Result<Option<RestoreRow>> {
        let mut tx = self.pool().begin().await?;
        if !begin_restoring(&mut tx, t.id, None).await? {
            return Ok(None);
        }
        let row: RestoreRow = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "INSERT INTO etcd_restores (tenant_id, snapshot_id, state, requested_by)
             VALUES ($1, $2, $3, $4) RETURNING {RESTORE_COLUMNS}"
        )))
        .bind(t.id)
        .bind(snapshot.id)
        .bind(RestoreState::Running)
        .bind(actor)
        .fetch_one(&mut *tx)
        .await?;
        commit_work(
            tx,
            actor,
            "tenant.restore.start",
            Some(t.id),
            serde_json::json!({"restore": row.id, "snapshot": snapshot.number,
                "revision": snapshot.revision}),
        )
        .await?;
        Ok(Some(row))
    }

    /// Starts moving a Ready tenant (no upgrade or restore running) from plan `from` to plan
    /// `to`, whose data live in different stores: a logical snapshot asked for (taken by the
    /// move once the control plane is stopped) and a restore from it that switches the plan
    /// ([`Inventory::switch_plan`]) before it imports; phase `Restoring`, workers woken. `None`
    /// when the tenant is not Ready, no longer on `from`, or something else moves it.
    pub async fn start_move(
        &self,
        t: &Tenant,
        from: &str,
        to: &str,
        actor: &str,
    ) -> Result<Option<(SnapshotRow, RestoreRow)>> {
        let mut tx = self.pool().begin().await?;
        if !begin_restoring(&mut tx, t.id, Some(from)).await? {
            return Ok(None);
        }
        let snapshot = insert(&mut tx, t, None, actor).await?;
        let row: RestoreRow = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "INSERT INTO etcd_restores
               (tenant_id, snapshot_id, state, requested_by, from_plan, to_plan)
             VALUES ($1, $2, $3, $4, $5, $6) RETURNING {RESTORE_COLUMNS}"
        )))
        .bind(t.id)
        .bind(snapshot.id)
        .bind(RestoreState::Running)
        .bind(actor)
        .bind(from)
        .bind(to)
        .fetch_one(&mut *tx)
        .await?;
        commit_work(
            tx,
            actor,
            "tenant.plan.move",
            Some(t.id),
            serde_json::json!({"restore": row.id, "snapshot": snapshot.number,
                "from": from, "to": to}),
        )
        .await?;
        Ok(Some((snapshot, row)))
    }

    /// A move's switch: its data exported, the tenant goes to the plan the move goes to
    /// (`back`: a failed import sends it back to the plan it left, whose store still holds its
    /// data). Once; whether this call switched it.
    pub async fn switch_plan(
        &self,
        t: &Tenant,
        r: &RestoreRow,
        back: bool,
        actor: &str,
    ) -> Result<bool> {
        let (Some(from), Some(to)) = (&r.from_plan, &r.to_plan) else {
            return Ok(false);
        };
        let (from, to) = if back { (to, from) } else { (from, to) };
        let mut tx = self.pool().begin().await?;
        let switched = sqlx::query(
            "UPDATE tenants SET plan = $3, generation = generation + 1, updated_at = now()
             WHERE id = $1 AND plan = $2 AND deleted_at IS NULL",
        )
        .bind(t.id)
        .bind(from)
        .bind(to)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if switched {
            audit_in(
                &mut tx,
                actor,
                "tenant.plan",
                Some(t.id),
                serde_json::json!({"from": from, "to": to, "restore": r.id}),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(switched)
    }

    /// The restore moving a tenant now, if any.
    pub async fn active_restore(&self, tenant_id: i64) -> Result<Option<RestoreRow>> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {RESTORE_COLUMNS} FROM etcd_restores
                 WHERE tenant_id = $1 AND state = 'Running'"
        )))
        .bind(tenant_id)
        .fetch_optional(self.pool())
        .await?)
    }

    /// A tenant's restores, newest first.
    pub async fn restores(&self, tenant_id: i64) -> Result<Vec<RestoreRow>> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {RESTORE_COLUMNS} FROM etcd_restores WHERE tenant_id = $1 ORDER BY id DESC"
        )))
        .bind(tenant_id)
        .fetch_all(self.pool())
        .await?)
    }
}

/// Moves a Ready tenant (still on plan `plan`, if given) with no upgrade or restore running
/// to phase `Restoring` and due now: what starts a restore and a move. Whether it did.
async fn begin_restoring(
    tx: &mut sqlx::PgConnection,
    tenant_id: i64,
    plan: Option<&str>,
) -> Result<bool> {
    let moved = sqlx::query(
        "UPDATE tenants SET phase = $2, generation = generation + 1,
           next_reconcile_at = now(), updated_at = now()
         WHERE id = $1 AND deleted_at IS NULL AND desired = $3 AND phase = $4
           AND ($6::text IS NULL OR plan = $6)
           AND NOT EXISTS (SELECT 1 FROM tenant_upgrades
                           WHERE tenant_id = $1 AND state = ANY($5))
           AND NOT EXISTS (SELECT 1 FROM etcd_restores
                           WHERE tenant_id = $1 AND state = 'Running')",
    )
    .bind(tenant_id)
    .bind(Phase::Restoring)
    .bind(Desired::Present)
    .bind(Phase::Ready)
    .bind(vcp_core::lifecycle::UpgradeState::active_names())
    .bind(plan)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    Ok(moved == 1)
}

/// Writes what a pass means for a restore, in the pass's transaction.
pub(crate) async fn apply_restore(
    tx: &mut sqlx::PgConnection,
    tenant: i64,
    restore: i64,
    r: &NewRestore,
    actor: &str,
) -> Result<()> {
    let (state, restored, reason, action) = match r {
        NewRestore::Restored => (RestoreState::Running, true, None, "tenant.restore.restored"),
        NewRestore::Succeeded => (
            RestoreState::Succeeded,
            true,
            None,
            "tenant.restore.succeeded",
        ),
        NewRestore::Failed(why) => (
            RestoreState::Failed,
            false,
            Some(why.as_str()),
            "tenant.restore.failed",
        ),
    };
    let done = sqlx::query(
        "UPDATE etcd_restores SET state = $3, restored = restored OR $4, reason = $5,
           finished_at = CASE WHEN $3 = 'Running' THEN NULL ELSE now() END
         WHERE id = $1 AND tenant_id = $2 AND state = 'Running'",
    )
    .bind(restore)
    .bind(tenant)
    .bind(state)
    .bind(restored)
    .bind(reason)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if done == 1 {
        sqlx::query("UPDATE tenants SET next_reconcile_at = now() WHERE id = $1")
            .bind(tenant)
            .execute(&mut *tx)
            .await?;
        audit_in(
            tx,
            actor,
            action,
            Some(tenant),
            serde_json::json!({"restore": restore, "reason": reason}),
        )
        .await?;
    }
    Ok(())
}
