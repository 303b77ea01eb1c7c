//! Fleet upgrades in the inventory: `fleet_upgrades` (one row per fleet upgrade: its request,
//! where it is, a row lease) and `fleet_upgrade_tenants` (one row per tenant it covers).
//!
//! Data flow: the API stores a planned fleet upgrade ([`Inventory::create_fleet`]); a fleet
//! worker of any replica claims it ([`Inventory::claim_fleet`], `FOR UPDATE SKIP LOCKED` and
//! a lease, as tenants are claimed), reads its entries with their tenants' own upgrades
//! ([`Inventory::fleet_entries`]), records what a step decided ([`Inventory::record_fleet_step`])
//! and starts tenants one transaction each ([`Inventory::start_fleet_tenant`]): the fleet row
//! locked under our lease, the entry still `Pending`, the tenant's upgrade inserted (the same
//! statement a `PATCH` runs) and the entry marked `Running` with its upgrade id, or none of it.
//! A replica killed anywhere leaves either a started tenant with its entry `Running` or an
//! untouched `Pending` entry; another replica, once the lease runs out, continues from there
//! and cannot start the same entry again. Every transition is audited.

use crate::Result;
use crate::inventory::{Inventory, Tenant, audit_in, commit_work, notify};
use crate::lifecycle::fleet::{Counts, Planned, Progress, Step};
use crate::upgrades::store::{NewUpgrade, start_upgrade_in};
use crate::window::MaintenanceWindow;
use sqlx::types::Json;
use std::collections::BTreeMap;
use std::time::Duration;
use time::OffsetDateTime;
use vcp_core::lifecycle::{FleetEntryState, FleetState, Phase, UpgradeState};

/// A fleet upgrade to store.
#[derive(Debug, Clone)]
pub struct NewFleet {
    pub target: String,
    /// The request's selector as given, for people.
    pub selector: serde_json::Value,
    pub chain: bool,
    pub canary: u32,
    pub max_parallel: u32,
    pub failure_budget: u32,
    pub soak_seconds: u32,
    pub respect_maintenance_windows: bool,
    /// Its tenants, from [`crate::lifecycle::fleet::plan`].
    pub entries: Vec<Planned>,
}

/// A fleet upgrade, as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct FleetRow {
    pub id: i64,
    pub target_version: String,
    pub selector: Json<serde_json::Value>,
    pub chain: bool,
    pub canary: i32,
    pub max_parallel: i32,
    pub failure_budget: i32,
    pub soak_seconds: i32,
    pub respect_maintenance_windows: bool,
    pub state: FleetState,
    pub current_wave: i32,
    pub soak_until: Option<OffsetDateTime>,
    pub reason: Option<String>,
    pub created_by: String,
    pub created_at: OffsetDateTime,
    pub finished_at: Option<OffsetDateTime>,
}

impl FleetRow {
    /// Where it is, as [`crate::lifecycle::fleet::step`] takes it.
    pub fn progress(&self) -> Progress {
        Progress {
            state: self.state,
            current_wave: u32::try_from(self.current_wave).unwrap_or(0),
            soak_until: self.soak_until,
            reason: self.reason.clone(),
        }
    }
}

const FLEET_COLUMNS: &str = "id, target_version, selector, chain, canary, max_parallel, \
     failure_budget, soak_seconds, respect_maintenance_windows, state, current_wave, soak_until, \
     reason, created_by, created_at, finished_at";

/// One tenant of a fleet upgrade, with what the step needs of its tenant and its upgrade.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct FleetEntryRow {
    pub tenant_id: i64,
    pub name: String,
    /// Names are unique per owner only: the name and its owner tell two entries apart.
    pub owner: String,
    pub plan: String,
    pub maintenance_window: Option<Json<MaintenanceWindow>>,
    pub wave: i32,
    pub from_version: String,
    pub target_version: String,
    pub chain: bool,
    pub forced: Option<String>,
    pub state: FleetEntryState,
    pub upgrade_id: Option<i64>,
    pub reason: Option<String>,
    pub started_at: Option<OffsetDateTime>,
    pub finished_at: Option<OffsetDateTime>,
    /// Its tenant upgrade's state and reason, once started.
    pub upgrade_state: Option<UpgradeState>,
    pub upgrade_reason: Option<String>,
}

/// A fleet upgrade's entries in numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FleetSummary {
    pub counts: Counts,
    /// Waves planned.
    pub waves: u32,
    /// Mean time of its finished tenant upgrades, in seconds.
    pub mean_seconds: Option<f64>,
}

/// What an admin does to a fleet upgrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FleetAction {
    Pause,
    Resume,
    Cancel,
}

impl FleetAction {
    pub fn as_str(self) -> &'static str {
        match self {
            FleetAction::Pause => "pause",
            FleetAction::Resume => "resume",
            FleetAction::Cancel => "cancel",
        }
    }

    /// The states it applies to, and the state it leads to.
    fn transition(self) -> (&'static [FleetState], FleetState) {
        match self {
            FleetAction::Pause => (&[FleetState::Running], FleetState::Paused),
            FleetAction::Resume => (&[FleetState::Paused], FleetState::Running),
            FleetAction::Cancel => (
                &[FleetState::Running, FleetState::Paused],
                FleetState::Cancelled,
            ),
        }
    }
}

/// What [`Inventory::fleet_action`] did.
#[derive(Debug)]
pub enum ActionOutcome {
    Done(FleetRow),
    NoSuchFleet,
    /// The fleet upgrade is in a state the action does not apply to.
    Refused(FleetState),
}

/// What [`Inventory::start_fleet_tenant`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartOutcome {
    /// The tenant's upgrade started; the entry is `Running` with this upgrade id.
    Started(i64),
    /// The tenant will not be started; the entry is `Skipped` with this reason.
    Skipped(String),
    /// Not now (the tenant is still provisioning, or another upgrade moves it); the entry
    /// stays `Pending`.
    Waiting(String),
    /// Nothing done: the entry is not `Pending` any more, or our lease is gone, or the fleet
    /// upgrade is not running.
    NotOurs,
}

impl Inventory {
    /// Stores a planned fleet upgrade and its entries (those the plan skips as `Skipped`
    /// with its reason), audited, and wakes the workers.
    pub async fn create_fleet(&self, f: &NewFleet, actor: &str) -> Result<FleetRow> {
        let mut tx = self.pool().begin().await?;
        let row: FleetRow = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "INSERT INTO fleet_upgrades (target_version, selector, chain, canary, max_parallel,
               failure_budget, soak_seconds, respect_maintenance_windows, state, created_by)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING {FLEET_COLUMNS}"
        )))
        .bind(&f.target)
        .bind(Json(&f.selector))
        .bind(f.chain)
        .bind(to_i32(f.canary))
        .bind(to_i32(f.max_parallel))
        .bind(to_i32(f.failure_budget))
        .bind(to_i32(f.soak_seconds))
        .bind(f.respect_maintenance_windows)
        .bind(FleetState::Running)
        .bind(actor)
        .fetch_one(&mut *tx)
        .await?;
        for (i, p) in f.entries.iter().enumerate() {
            let (state, finished) = match &p.skip {
                Some(_) => (FleetEntryState::Skipped, Some(OffsetDateTime::now_utc())),
                None => (FleetEntryState::Pending, None),
            };
            sqlx::query(
                "INSERT INTO fleet_upgrade_tenants (fleet_id, tenant_id, wave, ordinal,
                   from_version, target_version, chain, forced, state, reason, finished_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            )
            .bind(row.id)
            .bind(p.tenant_id)
            .bind(to_i32(p.wave))
            .bind(i32::try_from(i).unwrap_or(i32::MAX))
            .bind(&p.from)
            .bind(&p.target)
            .bind(p.chain)
            .bind(&p.forced)
            .bind(state)
            .bind(&p.skip)
            .bind(finished)
            .execute(&mut *tx)
            .await?;
        }
        commit_work(
            tx,
            actor,
            "fleet.create",
            None,
            serde_json::json!({"fleet_upgrade": row.id, "target": f.target,
                "selector": f.selector, "tenants": f.entries.len(),
                "waves": f.entries.iter().map(|p| p.wave + 1).max().unwrap_or(0)}),
        )
        .await?;
        Ok(row)
    }

    /// Every fleet upgrade, newest first.
    pub async fn fleets(&self) -> Result<Vec<FleetRow>> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {FLEET_COLUMNS} FROM fleet_upgrades ORDER BY id DESC"
        )))
        .fetch_all(self.pool())
        .await?)
    }

    /// A fleet upgrade by id.
    pub async fn fleet(&self, id: i64) -> Result<Option<FleetRow>> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {FLEET_COLUMNS} FROM fleet_upgrades WHERE id = $1"
        )))
        .bind(id)
        .fetch_optional(self.pool())
        .await?)
    }

    /// A fleet upgrade's entries in plan order, with their tenants' names, owners, plans and windows
    /// and their own upgrades' states.
    pub async fn fleet_entries(&self, id: i64) -> Result<Vec<FleetEntryRow>> {
        Ok(sqlx::query_as(
            "SELECT e.tenant_id, t.name, t.owner, t.plan, t.maintenance_window, e.wave, e.from_version,
               e.target_version, e.chain, e.forced, e.state, e.upgrade_id, e.reason,
               e.started_at, e.finished_at, u.state AS upgrade_state, u.reason AS upgrade_reason
             FROM fleet_upgrade_tenants e
             JOIN tenants t ON t.id = e.tenant_id
             LEFT JOIN tenant_upgrades u ON u.id = e.upgrade_id
             WHERE e.fleet_id = $1 ORDER BY e.ordinal",
        )
        .bind(id)
        .fetch_all(self.pool())
        .await?)
    }

    /// Each of these fleet upgrades' entry counts, waves and mean tenant upgrade time.
    pub async fn fleet_summaries(&self, ids: &[i64]) -> Result<BTreeMap<i64, FleetSummary>> {
        let counts: Vec<(i64, FleetEntryState, i64)> = sqlx::query_as(
            "SELECT fleet_id, state, count(*) FROM fleet_upgrade_tenants
             WHERE fleet_id = ANY($1) GROUP BY fleet_id, state",
        )
        .bind(ids)
        .fetch_all(self.pool())
        .await?;
        let rest: Vec<(i64, i32, Option<f64>)> = sqlx::query_as(
            "SELECT fleet_id, max(wave) + 1,
               (avg(EXTRACT(EPOCH FROM finished_at - started_at))
                  FILTER (WHERE started_at IS NOT NULL AND finished_at IS NOT NULL))::float8
             FROM fleet_upgrade_tenants WHERE fleet_id = ANY($1) GROUP BY fleet_id",
        )
        .bind(ids)
        .fetch_all(self.pool())
        .await?;
        let mut out: BTreeMap<i64, FleetSummary> = BTreeMap::new();
        for (id, waves, mean) in rest {
            let e = out.entry(id).or_default();
            e.waves = u32::try_from(waves).unwrap_or(0);
            e.mean_seconds = mean;
        }
        for (id, state, n) in counts {
            let n = u32::try_from(n).unwrap_or(u32::MAX);
            let c = &mut out.entry(id).or_default().counts;
            *match state {
                FleetEntryState::Pending => &mut c.pending,
                FleetEntryState::Running => &mut c.running,
                FleetEntryState::Succeeded => &mut c.succeeded,
                FleetEntryState::Failed => &mut c.failed,
                FleetEntryState::Skipped => &mut c.skipped,
            } += n;
        }
        Ok(out)
    }

    /// Pauses, resumes or cancels a fleet upgrade; a cancel skips the entries not started
    /// (started tenants finish their own upgrades: stopping one half-way is what a rollback
    /// is for, not a cancel).
    pub async fn fleet_action(
        &self,
        id: i64,
        action: FleetAction,
        reason: Option<&str>,
        actor: &str,
    ) -> Result<ActionOutcome> {
        let (from, to) = action.transition();
        let mut tx = self.pool().begin().await?;
        let Some(current) = sqlx::query_scalar::<_, FleetState>(
            "SELECT state FROM fleet_upgrades WHERE id = $1 FOR UPDATE",
        )
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?
        else {
            return Ok(ActionOutcome::NoSuchFleet);
        };
        if !from.contains(&current) {
            return Ok(ActionOutcome::Refused(current));
        }
        let why = match (action, reason) {
            (FleetAction::Cancel, Some(r)) => Some(format!("cancelled by {actor}: {r}")),
            (FleetAction::Cancel, None) => Some(format!("cancelled by {actor}")),
            (_, r) => r.map(str::to_owned),
        };
        let row: FleetRow = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "UPDATE fleet_upgrades SET state = $2, reason = COALESCE($3, reason),
               finished_at = CASE WHEN $4 THEN now() END, next_step_at = now()
             WHERE id = $1 RETURNING {FLEET_COLUMNS}"
        )))
        .bind(id)
        .bind(to)
        .bind(&why)
        .bind(to.finished())
        .fetch_one(&mut *tx)
        .await?;
        if action == FleetAction::Cancel {
            let skipped: Vec<i64> = sqlx::query_scalar(
                "UPDATE fleet_upgrade_tenants SET state = $3, reason = $4, finished_at = now()
                 WHERE fleet_id = $1 AND state = $2 RETURNING tenant_id",
            )
            .bind(id)
            .bind(FleetEntryState::Pending)
            .bind(FleetEntryState::Skipped)
            .bind(why.as_deref().unwrap_or("cancelled"))
            .fetch_all(&mut *tx)
            .await?;
            for t in skipped {
                audit_in(
                    &mut tx,
                    actor,
                    "fleet.tenant.skipped",
                    Some(t),
                    serde_json::json!({"fleet_upgrade": id, "reason": why}),
                )
                .await?;
            }
        }
        audit_in(
            &mut tx,
            actor,
            &format!("fleet.{}", action.as_str()),
            None,
            serde_json::json!({"fleet_upgrade": id, "from": current, "to": to, "reason": reason}),
        )
        .await?;
        notify(&mut tx).await?;
        tx.commit().await?;
        Ok(ActionOutcome::Done(row))
    }

    /// Claims the most overdue fleet upgrade that still has work (running or paused, or with
    /// tenants still moving) and no other worker holds, for `lease`.
    pub async fn claim_fleet(&self, worker: &str, lease: Duration) -> Result<Option<FleetRow>> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "UPDATE fleet_upgrades SET lease_owner = $1,
               lease_until = now() + make_interval(secs => $2),
               next_step_at = now() + make_interval(secs => $2)
             WHERE id = (
               SELECT id FROM fleet_upgrades f
               WHERE next_step_at <= now() AND (lease_until IS NULL OR lease_until < now())
                 AND (state = ANY($3) OR EXISTS (
                   SELECT 1 FROM fleet_upgrade_tenants e WHERE e.fleet_id = f.id AND e.state = $4))
               ORDER BY next_step_at LIMIT 1
               FOR UPDATE SKIP LOCKED)
             RETURNING {FLEET_COLUMNS}"
        )))
        .bind(worker)
        .bind(lease.as_secs_f64())
        .bind(
            FleetState::ALL
                .iter()
                .filter(|s| !s.finished())
                .map(|s| s.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(FleetEntryState::Running)
        .fetch_optional(self.pool())
        .await?)
    }

    /// Writes what a step decided of entries and of the fleet upgrade itself (not the starts:
    /// [`Inventory::start_fleet_tenant`] does each), if `worker` still holds the lease.
    /// Returns false if it does not (another worker owns the fleet upgrade now).
    pub async fn record_fleet_step(
        &self,
        f: &FleetRow,
        worker: &str,
        s: &Step,
        actor: &str,
    ) -> Result<bool> {
        let mut tx = self.pool().begin().await?;
        if !hold(&mut tx, f.id, worker).await? {
            return Ok(false);
        }
        for (tenant, to, why) in &s.finished {
            // Only from a state it can leave: a step computed from stale rows writes nothing.
            let from = match to {
                FleetEntryState::Skipped => FleetEntryState::Pending,
                _ => FleetEntryState::Running,
            };
            let r = sqlx::query(
                "UPDATE fleet_upgrade_tenants SET state = $4, reason = COALESCE($5, reason),
                   finished_at = now()
                 WHERE fleet_id = $1 AND tenant_id = $2 AND state = $3",
            )
            .bind(f.id)
            .bind(tenant)
            .bind(from)
            .bind(to)
            .bind(why)
            .execute(&mut *tx)
            .await?;
            if r.rows_affected() == 1 {
                audit_in(
                    &mut tx,
                    actor,
                    &format!("fleet.tenant.{}", to.as_str().to_lowercase()),
                    Some(*tenant),
                    serde_json::json!({"fleet_upgrade": f.id, "reason": why}),
                )
                .await?;
            }
        }
        for (tenant, why) in &s.waiting {
            sqlx::query(
                "UPDATE fleet_upgrade_tenants SET reason = $3
                 WHERE fleet_id = $1 AND tenant_id = $2 AND state = $4
                   AND reason IS DISTINCT FROM $3",
            )
            .bind(f.id)
            .bind(tenant)
            .bind(why)
            .bind(FleetEntryState::Pending)
            .execute(&mut *tx)
            .await?;
        }
        let p = &s.progress;
        let before = f.progress();
        if *p != before {
            sqlx::query(
                "UPDATE fleet_upgrades SET state = $2, current_wave = $3, soak_until = $4,
                   reason = $5, finished_at = CASE WHEN $6 THEN now() END
                 WHERE id = $1",
            )
            .bind(f.id)
            .bind(p.state)
            .bind(to_i32(p.current_wave))
            .bind(p.soak_until)
            .bind(&p.reason)
            .bind(p.state.finished())
            .execute(&mut *tx)
            .await?;
            let action = if p.state != before.state {
                format!("fleet.{}", p.state.as_str().to_lowercase())
            } else if p.current_wave != before.current_wave {
                "fleet.wave".to_owned()
            } else {
                "fleet.soak".to_owned()
            };
            audit_in(
                &mut tx,
                actor,
                &action,
                None,
                serde_json::json!({"fleet_upgrade": f.id, "state": p.state,
                    "wave": p.current_wave, "soak_until": p.soak_until, "reason": p.reason}),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Starts one tenant of a fleet upgrade, all or nothing, in one transaction: under our
    /// lease on a running fleet upgrade, with its entry still `Pending`, the tenant's upgrade
    /// (to the entry's target, `first_hop` first) and the entry's `Running` with the upgrade
    /// id. A tenant that cannot start is `Skipped` with the reason, or left `Pending` when it
    /// only has to wait.
    pub async fn start_fleet_tenant(
        &self,
        fleet: i64,
        worker: &str,
        e: &FleetEntryRow,
        first_hop: &str,
        actor: &str,
    ) -> Result<StartOutcome> {
        let mut tx = self.pool().begin().await?;
        if !hold(&mut tx, fleet, worker).await? {
            return Ok(StartOutcome::NotOurs);
        }
        let running: Option<FleetState> =
            sqlx::query_scalar("SELECT state FROM fleet_upgrades WHERE id = $1")
                .bind(fleet)
                .fetch_optional(&mut *tx)
                .await?;
        if running != Some(FleetState::Running) {
            return Ok(StartOutcome::NotOurs);
        }
        // The entry row lock: a second transaction for the same entry waits here, then finds
        // it no longer Pending.
        let entry: Option<(String, Option<String>)> = sqlx::query_as(
            "SELECT from_version, forced FROM fleet_upgrade_tenants
             WHERE fleet_id = $1 AND tenant_id = $2 AND state = $3 FOR UPDATE",
        )
        .bind(fleet)
        .bind(e.tenant_id)
        .bind(FleetEntryState::Pending)
        .fetch_optional(&mut *tx)
        .await?;
        let Some((from, forced)) = entry else {
            return Ok(StartOutcome::NotOurs);
        };
        let requested_by = match &forced {
            Some(why) => format!("fleet-upgrade/{fleet}: {why}"),
            None => format!("fleet-upgrade/{fleet}"),
        };
        let new = NewUpgrade {
            target: e.target_version.clone(),
            chain: e.chain,
            first_hop: first_hop.to_owned(),
            // The catalog's release of that minor (the versions table this replica wrote).
            to_release: None,
            expect_release: None,
        };
        let started = start_upgrade_in(
            &mut tx,
            e.tenant_id,
            &from,
            None,
            &new,
            &requested_by,
            actor,
        )
        .await?;
        let outcome = match started {
            Some((_, up)) => {
                sqlx::query(
                    "UPDATE fleet_upgrade_tenants SET state = $3, upgrade_id = $4,
                       started_at = now(), reason = NULL
                     WHERE fleet_id = $1 AND tenant_id = $2",
                )
                .bind(fleet)
                .bind(e.tenant_id)
                .bind(FleetEntryState::Running)
                .bind(up.id)
                .execute(&mut *tx)
                .await?;
                audit_in(
                    &mut tx,
                    actor,
                    "fleet.tenant.start",
                    Some(e.tenant_id),
                    serde_json::json!({"fleet_upgrade": fleet, "upgrade": up.id,
                        "from": from, "to": e.target_version, "forced": forced}),
                )
                .await?;
                StartOutcome::Started(up.id)
            }
            None => {
                let t: Option<Tenant> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "SELECT {} FROM tenants WHERE id = $1",
                    crate::inventory::TENANT_COLUMNS
                )))
                .bind(e.tenant_id)
                .fetch_optional(&mut *tx)
                .await?;
                let moving: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM tenant_upgrades
                                    WHERE tenant_id = $1 AND state = ANY($2))",
                )
                .bind(e.tenant_id)
                .bind(UpgradeState::active_names())
                .fetch_one(&mut *tx)
                .await?;
                let outcome = why_not(t.as_ref(), &from, moving);
                if let StartOutcome::Skipped(why) = &outcome {
                    sqlx::query(
                        "UPDATE fleet_upgrade_tenants SET state = $3, reason = $4,
                           finished_at = now()
                         WHERE fleet_id = $1 AND tenant_id = $2",
                    )
                    .bind(fleet)
                    .bind(e.tenant_id)
                    .bind(FleetEntryState::Skipped)
                    .bind(why)
                    .execute(&mut *tx)
                    .await?;
                    audit_in(
                        &mut tx,
                        actor,
                        "fleet.tenant.skipped",
                        Some(e.tenant_id),
                        serde_json::json!({"fleet_upgrade": fleet, "reason": why}),
                    )
                    .await?;
                }
                outcome
            }
        };
        tx.commit().await?;
        Ok(outcome)
    }

    /// Releases a fleet upgrade's lease; it is due again after `after`, or at once if one
    /// of its tenants' upgrades ended while we held it ([`crate::inventory`]'s `fleet_due_now`).
    pub async fn release_fleet(&self, id: i64, worker: &str, after: Duration) -> Result<()> {
        sqlx::query(
            "UPDATE fleet_upgrades SET lease_owner = NULL, lease_until = NULL,
               next_step_at = LEAST(next_step_at, now() + make_interval(secs => $3))
             WHERE id = $1 AND lease_owner = $2",
        )
        .bind(id)
        .bind(worker)
        .bind(after.as_secs_f64())
        .execute(self.pool())
        .await?;
        Ok(())
    }
}

/// Locks the fleet row if `worker` holds its lease; false otherwise.
async fn hold(tx: &mut sqlx::PgConnection, fleet: i64, worker: &str) -> Result<bool> {
    Ok(sqlx::query_scalar::<_, i64>(
        "SELECT id FROM fleet_upgrades
         WHERE id = $1 AND lease_owner = $2 AND lease_until > now() FOR UPDATE",
    )
    .bind(fleet)
    .bind(worker)
    .fetch_optional(&mut *tx)
    .await?
    .is_some())
}

/// Why a tenant's upgrade did not start: skip it, or let it wait.
fn why_not(t: Option<&Tenant>, from: &str, moving: bool) -> StartOutcome {
    let Some(t) = t.filter(|t| t.deleted_at.is_none()) else {
        return StartOutcome::Skipped("the tenant was deleted".into());
    };
    if t.desired != vcp_core::lifecycle::Desired::Present {
        return StartOutcome::Skipped("the tenant is being deleted".into());
    }
    if moving {
        return StartOutcome::Waiting("another upgrade moves the tenant".into());
    }
    if t.version != from {
        return StartOutcome::Skipped(format!(
            "the tenant runs {} now, not {from} as planned",
            t.version
        ));
    }
    match t.phase {
        // Still coming up (or finishing another change): its turn waits for it.
        Phase::Pending | Phase::Provisioning | Phase::Upgrading => {
            StartOutcome::Waiting(format!("the tenant is {}", t.phase))
        }
        other => StartOutcome::Skipped(format!(
            "the tenant was {other} when its turn came; upgrades start from Ready"
        )),
    }
}

fn to_i32(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}
