//! Tenant upgrades in the inventory (`tenant_upgrades`): started, moved hop by hop, ended.
//!
//! Data flow: a `PATCH /v1/tenants/{name}`, a fleet upgrade's turn or an automatic patch
//! update starts an upgrade through one statement ([`start_upgrade_in`]: the tenant locked,
//! no other upgrade active, the first hop and its snapshot recorded, audited). Each reconcile
//! pass reads the active upgrade ([`Inventory::active_upgrade`]) and the hop machine
//! ([`crate::lifecycle::upgrade`]) decides a [`Transition`], which [`apply_transition`] writes
//! in the pass's own transaction: the next hop (with its snapshot), done, or rolled back. An
//! upgrade that ends makes the fleet upgrade that started it due at once.

use crate::Result;
use crate::inventory::{Inventory, TENANT_COLUMNS, Tenant, audit_in, notify};
use crate::lifecycle::upgrade::{Active, HopSnapshot, Transition};
use crate::snapshots::store::{RESTORE_COLUMNS, RestoreRow, SnapshotRow, insert};
use std::collections::BTreeMap;
use time::OffsetDateTime;
use vcp_core::lifecycle::RestoreState;
use vcp_core::lifecycle::{AutoUpdate, Desired, Phase, SnapshotState, UpgradeState};

/// One upgrade of a tenant, as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct UpgradeRow {
    pub id: i64,
    pub tenant_id: i64,
    pub from_version: String,
    pub target_version: String,
    pub chain: bool,
    pub hop_from: String,
    pub hop_to: String,
    pub hop_started_at: OffsetDateTime,
    pub state: UpgradeState,
    pub reason: Option<String>,
    pub requested_by: String,
    pub created_at: OffsetDateTime,
    pub finished_at: Option<OffsetDateTime>,
    /// The snapshot taken before the current hop.
    pub snapshot_id: Option<i64>,
    /// The releases of the current hop (migration 0007): the tenant's when it started, and
    /// where it goes (`None`: the catalog's release of `hop_to`).
    pub hop_from_release: Option<String>,
    pub hop_to_release: Option<String>,
    /// The restore of that snapshot a rollback started (migration 0006), if it needed one.
    pub restore_id: Option<i64>,
    /// That restore's state; read by [`Inventory::latest_upgrades`] and
    /// [`Inventory::latest_upgrade`] only (`None` elsewhere).
    #[sqlx(default)]
    pub restore_state: Option<vcp_core::lifecycle::RestoreState>,
}

impl UpgradeRow {
    /// What a pass needs of it, with the current hop's snapshot as read.
    pub fn active(&self, snapshot: Option<&SnapshotRow>) -> Active {
        let snapshot = snapshot.map(|s| match s.state {
            SnapshotState::Pending => HopSnapshot::Pending,
            SnapshotState::Succeeded => HopSnapshot::Taken(s.id),
            SnapshotState::Failed => HopSnapshot::Failed(s.reason.clone().unwrap_or_default()),
        });
        Active {
            snapshot,
            id: self.id,
            target: self.target_version.clone(),
            chain: self.chain,
            hop_from: self.hop_from.clone(),
            hop_to: self.hop_to.clone(),
            hop_from_release: self.hop_from_release.clone(),
            hop_to_release: self.hop_to_release.clone(),
            hop_started_at: self.hop_started_at,
            state: self.state,
        }
    }
}

/// An upgrade to start.
#[derive(Debug, Clone)]
pub struct NewUpgrade {
    pub target: String,
    pub chain: bool,
    /// The first hop's end.
    pub first_hop: String,
    /// The release the first hop goes to; `None`: the catalog's release of `first_hop`. A
    /// patch update names it (and its hop stays inside the tenant's minor).
    pub to_release: Option<String>,
    /// Start only if the tenant still runs this release (a patch update decided on it).
    pub expect_release: Option<String>,
}

/// Starts an upgrade inside `tx` (see [`Inventory::start_upgrade`]): the tenant `tenant_id`
/// must be live, Ready, on `from`, (`owner`'s, if given) and not moved by another upgrade.
/// `requested_by` is what the upgrade shows as its origin; `actor` is the audit's.
pub(crate) async fn start_upgrade_in(
    tx: &mut sqlx::PgConnection,
    tenant_id: i64,
    from: &str,
    owner: Option<&str>,
    u: &NewUpgrade,
    requested_by: &str,
    actor: &str,
) -> Result<Option<(Tenant, UpgradeRow)>> {
    // The phase check and the phase switch are one statement, so two requests racing for
    // one tenant cannot both pass it; the unique index catches what else could. The version
    // stays until the hop's snapshot is taken.
    let row: Option<Tenant> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "UPDATE tenants SET phase = $4, generation = generation + 1,
           next_reconcile_at = now(), updated_at = now()
         WHERE id = $1 AND deleted_at IS NULL AND desired = $5 AND phase = $6
           AND version = $3 AND ($2::text IS NULL OR owner = $2)
           AND ($8::text IS NULL OR release = $8)
           AND NOT EXISTS (SELECT 1 FROM tenant_upgrades
                           WHERE tenant_id = $1 AND state = ANY($7))
           AND NOT EXISTS (SELECT 1 FROM etcd_restores
                           WHERE tenant_id = $1 AND state = 'Running')
         RETURNING {TENANT_COLUMNS}"
    )))
    .bind(tenant_id)
    .bind(owner)
    .bind(from)
    .bind(Phase::Upgrading)
    .bind(Desired::Present)
    .bind(Phase::Ready)
    .bind(UpgradeState::active_names())
    .bind(&u.expect_release)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let up: UpgradeRow = sqlx::query_as(
        "INSERT INTO tenant_upgrades
           (tenant_id, from_version, target_version, chain, hop_from, hop_to, state,
            requested_by, hop_from_release, hop_to_release)
         VALUES ($1, $2, $3, $4, $2, $5, $6, $7, $8, $9)
         RETURNING *",
    )
    .bind(tenant_id)
    .bind(from)
    .bind(&u.target)
    .bind(u.chain)
    .bind(&u.first_hop)
    .bind(UpgradeState::Snapshotting)
    .bind(requested_by)
    .bind(&row.release)
    .bind(&u.to_release)
    .fetch_one(&mut *tx)
    .await?;
    let (up, snapshot) = snapshot_hop(&mut *tx, &row, up.id, actor).await?;
    audit_in(
        &mut *tx,
        actor,
        "tenant.upgrade.start",
        Some(tenant_id),
        serde_json::json!({"upgrade": up.id, "from": from, "to": u.target,
            "chain": u.chain, "hop": u.first_hop, "requested_by": requested_by,
            "from_release": row.release, "to_release": u.to_release,
            "snapshot": snapshot}),
    )
    .await?;
    notify(&mut *tx).await?;
    Ok(Some((row, up)))
}

/// Makes the fleet upgrade that started tenant upgrade `upgrade` (if one did) due at once and
/// wakes the workers: its entry's end is recorded, and the slot refilled, by the next step
/// rather than at the fleet worker's poll. A step running under a lease meanwhile keeps it
/// due: [`Inventory::claim_fleet`](crate::upgrades::fleet_store) moves `next_step_at` to the lease's end, and
/// `Inventory::release_fleet` keeps the earlier of that and its own wake-up.
async fn fleet_due_now(tx: &mut sqlx::PgConnection, upgrade: i64) -> Result<()> {
    let r = sqlx::query(
        "UPDATE fleet_upgrades SET next_step_at = now()
         WHERE id IN (SELECT fleet_id FROM fleet_upgrade_tenants WHERE upgrade_id = $1)
           AND next_step_at > now()",
    )
    .bind(upgrade)
    .execute(&mut *tx)
    .await?;
    if r.rows_affected() > 0 {
        notify(tx).await?;
    }
    Ok(())
}

/// Writes what a pass means for an upgrade: the upgrade's row (and the next hop's snapshot
/// request), and the tenant's version when a hop starts or rolls back (due again at once, so
/// the next pass rolls the new version).
pub(crate) async fn apply_transition(
    tx: &mut sqlx::PgConnection,
    tenant: i64,
    upgrade: i64,
    tr: &Transition,
    actor: &str,
) -> Result<()> {
    let (state, reason, hop): (UpgradeState, Option<&str>, Option<&str>) = match tr {
        Transition::Wait(_) => return Ok(()),
        Transition::StartHop => (UpgradeState::Running, None, None),
        Transition::Abort(why) => (UpgradeState::RolledBack, Some(why), None),
        Transition::NextHop { to, .. } => (UpgradeState::Snapshotting, None, Some(to)),
        Transition::Succeeded => (UpgradeState::Succeeded, None, None),
        Transition::RollBack { reason, .. } => (UpgradeState::RollingBack, Some(reason), None),
        Transition::RolledBack => (UpgradeState::RolledBack, None, None),
    };
    let row: Option<UpgradeRow> = sqlx::query_as(
        "UPDATE tenant_upgrades SET state = $3,
           reason = COALESCE($4, reason),
           hop_from = CASE WHEN $5::text IS NULL THEN hop_from ELSE hop_to END,
           hop_to = COALESCE($5, hop_to),
           hop_from_release = CASE WHEN $5::text IS NULL THEN hop_from_release
             ELSE (SELECT release FROM tenants WHERE id = $2) END,
           hop_to_release = CASE WHEN $5::text IS NULL THEN hop_to_release END,
           hop_started_at = CASE WHEN $5::text IS NULL AND $3 <> 'Running' THEN hop_started_at
             ELSE now() END,
           finished_at = CASE WHEN $3 IN ('Succeeded', 'RolledBack') THEN now() END
         WHERE id = $1 AND tenant_id = $2 AND state = ANY($6)
         RETURNING *",
    )
    .bind(upgrade)
    .bind(tenant)
    .bind(state)
    .bind(reason)
    .bind(hop)
    .bind(UpgradeState::active_names())
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else {
        // Finished by someone else meanwhile: nothing of ours to write.
        return Ok(());
    };
    if !row.state.active() {
        // The upgrade ended: a fleet upgrade that started it has a slot free (or a wave
        // done) now, so it is due at once instead of at its next poll.
        fleet_due_now(&mut *tx, row.id).await?;
    }
    if matches!(tr, Transition::NextHop { .. }) {
        let t: Tenant = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {TENANT_COLUMNS} FROM tenants WHERE id = $1"
        )))
        .bind(tenant)
        .fetch_one(&mut *tx)
        .await?;
        snapshot_hop(&mut *tx, &t, row.id, actor).await?;
    }
    // The version the control plane runs next: the started hop's end, or the rollback's
    // target, each with its release (a hop between minors goes to the release the catalog
    // this replica serves names for the new minor).
    let version = match tr {
        Transition::StartHop => Some((row.hop_to.as_str(), row.hop_to_release.as_deref())),
        Transition::RollBack { .. } => {
            Some((row.hop_from.as_str(), row.hop_from_release.as_deref()))
        }
        _ => None,
    };
    if let Some((v, release)) = version {
        sqlx::query(
            "UPDATE tenants SET version = $2,
               release = COALESCE($3, (SELECT kubernetes FROM versions WHERE minor = $2)),
               next_reconcile_at = now(), updated_at = now()
             WHERE id = $1",
        )
        .bind(tenant)
        .bind(v)
        .bind(release)
        .execute(&mut *tx)
        .await?;
    }
    if let Transition::RollBack {
        restore: Some((snapshot, why)),
        ..
    } = tr
    {
        restore_for_rollback(&mut *tx, tenant, &row, *snapshot, why, actor).await?;
    }
    let action = match tr {
        Transition::StartHop => "tenant.upgrade.hop-started",
        Transition::Abort(_) => "tenant.upgrade.aborted",
        Transition::NextHop { .. } => "tenant.upgrade.hop",
        Transition::Succeeded => "tenant.upgrade.succeeded",
        Transition::RollBack { .. } => "tenant.upgrade.rollback",
        _ => "tenant.upgrade.rolled-back",
    };
    audit_in(
        tx,
        actor,
        action,
        Some(tenant),
        serde_json::json!({"upgrade": upgrade, "hop_from": row.hop_from, "hop_to": row.hop_to,
            "reason": row.reason}),
    )
    .await
}

/// Asks for the snapshot before an upgrade's current hop and links it to the upgrade; the
/// upgrade, and the snapshot's number.
pub(crate) async fn snapshot_hop(
    tx: &mut sqlx::PgConnection,
    t: &Tenant,
    upgrade: i64,
    actor: &str,
) -> Result<(UpgradeRow, i64)> {
    let s = insert(tx, t, Some(upgrade), actor).await?;
    let up =
        sqlx::query_as("UPDATE tenant_upgrades SET snapshot_id = $2 WHERE id = $1 RETURNING *")
            .bind(upgrade)
            .bind(s.id)
            .fetch_one(&mut *tx)
            .await?;
    Ok((up, s.number))
}

/// Starts the restore of a rolled-back hop's snapshot, in the transaction that starts the
/// rollback (the tenant's version is already the hop's start), and links it to the upgrade.
/// The tenant's next pass stops its control plane, restores every member and starts it again
/// on the old version, as for a restore an admin asked for; the upgrade ends `RolledBack`
/// once the control plane is healthy on it. Nothing else can be restoring the tenant: a
/// restore and an upgrade never run at once.
pub(crate) async fn restore_for_rollback(
    tx: &mut sqlx::PgConnection,
    tenant: i64,
    upgrade: &UpgradeRow,
    snapshot: i64,
    why: &str,
    actor: &str,
) -> Result<()> {
    if upgrade.restore_id.is_some() {
        // Started already: a hop is rolled back once.
        return Ok(());
    }
    let requested_by = format!(
        "tenant-upgrade/{}: rollback of hop {} -> {}: {why}",
        upgrade.id, upgrade.hop_from, upgrade.hop_to
    );
    let row: RestoreRow = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "INSERT INTO etcd_restores (tenant_id, snapshot_id, state, requested_by)
         VALUES ($1, $2, $3, $4) RETURNING {RESTORE_COLUMNS}"
    )))
    .bind(tenant)
    .bind(snapshot)
    .bind(RestoreState::Running)
    .bind(&requested_by)
    .fetch_one(&mut *tx)
    .await?;
    sqlx::query("UPDATE tenant_upgrades SET restore_id = $2 WHERE id = $1")
        .bind(upgrade.id)
        .bind(row.id)
        .execute(&mut *tx)
        .await?;
    audit_in(
        tx,
        actor,
        "tenant.restore.start",
        Some(tenant),
        serde_json::json!({"restore": row.id, "snapshot": row.snapshot_number, "upgrade": upgrade.id,
            "requested_by": requested_by}),
    )
    .await
}

impl Inventory {
    /// Starts an upgrade of a live tenant the caller may see (`owner`: an owner's own only),
    /// if it is `Ready` and no upgrade moves it already: records it, sets the tenant's version
    /// to the first hop and its phase to `Upgrading`, and wakes the workers. `Ok(None)` when
    /// the tenant is not there, not Ready, or already upgrading (the caller tells which).
    pub async fn start_upgrade(
        &self,
        t: &Tenant,
        owner: Option<&str>,
        u: &NewUpgrade,
        actor: &str,
    ) -> Result<Option<(Tenant, UpgradeRow)>> {
        let mut tx = self.pool().begin().await?;
        let started = start_upgrade_in(&mut tx, t.id, &t.version, owner, u, actor, actor).await?;
        if started.is_some() {
            tx.commit().await?;
        }
        Ok(started)
    }

    /// Tenants a patch update may start for (`crate::upgrades::auto`): live, present, Ready,
    /// with no upgrade or restore moving them, and not opted out on their own (a tenant with
    /// no setting follows its plan, which the caller knows); each with the releases its patch
    /// updates were rolled back from.
    pub async fn patch_update_candidates(&self) -> Result<Vec<(Tenant, Vec<String>)>> {
        let tenants: Vec<Tenant> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {TENANT_COLUMNS} FROM tenants t
             WHERE deleted_at IS NULL AND desired = $1 AND phase = $2
               AND (auto_update IS NULL OR auto_update = $3)
               AND NOT EXISTS (SELECT 1 FROM tenant_upgrades
                               WHERE tenant_id = t.id AND state = ANY($4))
               AND NOT EXISTS (SELECT 1 FROM etcd_restores
                               WHERE tenant_id = t.id AND state = 'Running')
             ORDER BY name"
        )))
        .bind(Desired::Present)
        .bind(Phase::Ready)
        .bind(AutoUpdate::Patch)
        .bind(UpgradeState::active_names())
        .fetch_all(self.pool())
        .await?;
        let ids: Vec<i64> = tenants.iter().map(|t| t.id).collect();
        let failed: Vec<(i64, String)> = sqlx::query_as(
            "SELECT tenant_id, hop_to_release FROM tenant_upgrades
             WHERE tenant_id = ANY($1) AND state = $2 AND hop_from = hop_to
               AND hop_to_release IS NOT NULL",
        )
        .bind(&ids)
        .bind(UpgradeState::RolledBack)
        .fetch_all(self.pool())
        .await?;
        let mut by_tenant: BTreeMap<i64, Vec<String>> = BTreeMap::new();
        for (id, r) in failed {
            by_tenant.entry(id).or_default().push(r);
        }
        Ok(tenants
            .into_iter()
            .map(|t| {
                let f = by_tenant.remove(&t.id).unwrap_or_default();
                (t, f)
            })
            .collect())
    }

    /// Starts a patch update of a tenant to `to` (a release of its minor) through the same
    /// transaction as any upgrade: one hop inside its minor, snapshot first. Only if the tenant
    /// is still Ready on the release it was decided on, with nothing moving it; the upgrade's
    /// id, or `None` when that no longer holds (another replica started it, say).
    pub async fn start_patch_update(
        &self,
        t: &Tenant,
        to: &str,
        requested_by: &str,
        actor: &str,
    ) -> Result<Option<i64>> {
        let new = NewUpgrade {
            target: t.version.clone(),
            chain: false,
            first_hop: t.version.clone(),
            to_release: Some(to.to_owned()),
            expect_release: t.release.clone(),
        };
        let mut tx = self.pool().begin().await?;
        let started =
            start_upgrade_in(&mut tx, t.id, &t.version, None, &new, requested_by, actor).await?;
        let Some((_, up)) = started else {
            return Ok(None);
        };
        tx.commit().await?;
        Ok(Some(up.id))
    }

    /// The upgrade moving a tenant now, if any.
    pub async fn active_upgrade(&self, tenant_id: i64) -> Result<Option<UpgradeRow>> {
        Ok(
            sqlx::query_as(
                "SELECT * FROM tenant_upgrades WHERE tenant_id = $1 AND state = ANY($2)",
            )
            .bind(tenant_id)
            .bind(UpgradeState::active_names())
            .fetch_optional(self.pool())
            .await?,
        )
    }

    /// The latest upgrade of each of these tenants that had one.
    pub async fn latest_upgrades(&self, ids: &[i64]) -> Result<BTreeMap<i64, UpgradeRow>> {
        let rows: Vec<UpgradeRow> = sqlx::query_as(
            "SELECT DISTINCT ON (u.tenant_id) u.*, r.state AS restore_state
             FROM tenant_upgrades u LEFT JOIN etcd_restores r ON r.id = u.restore_id
             WHERE u.tenant_id = ANY($1) ORDER BY u.tenant_id, u.id DESC",
        )
        .bind(ids)
        .fetch_all(self.pool())
        .await?;
        Ok(rows.into_iter().map(|u| (u.tenant_id, u)).collect())
    }

    /// A tenant's latest upgrade, active or finished.
    pub async fn latest_upgrade(&self, tenant_id: i64) -> Result<Option<UpgradeRow>> {
        Ok(sqlx::query_as(
            "SELECT u.*, r.state AS restore_state
             FROM tenant_upgrades u LEFT JOIN etcd_restores r ON r.id = u.restore_id
             WHERE u.tenant_id = $1 ORDER BY u.id DESC LIMIT 1",
        )
        .bind(tenant_id)
        .fetch_optional(self.pool())
        .await?)
    }
}
