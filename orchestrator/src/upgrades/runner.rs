//! The fleet worker of `vcp serve`: steps fleet upgrades (the I/O edge of [`crate::lifecycle::fleet`]).
//!
//! Data flow: claim a due fleet upgrade (a row lease, so one replica steps it at a time and
//! any replica takes over when a holder dies), read its entries with the state of each
//! tenant's own upgrade, resolve each tenant's maintenance window (its own, else its plan's),
//! ask [`fleet::step`] what to do, record the finished entries and the fleet's progress, then
//! start each chosen tenant in its own transaction ([`Inventory::start_fleet_tenant`]) and
//! release the lease until the next step is due. The tenant upgrades themselves are rolled by
//! the reconcile workers; this only decides who starts when.

use crate::Result;
use crate::host::Config;
use crate::inventory::Inventory;
use crate::lifecycle::fleet::{self, Entry, Pace};
use crate::lifecycle::skew::{self, Allow};
use crate::metrics::Metrics;
use crate::render::Plan;
use crate::upgrades::fleet_store::{FleetEntryRow, FleetRow, StartOutcome};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;
use tokio::sync::Notify;
use vcp_core::lifecycle::{FleetEntryState, FleetState};

/// How long a claimed fleet upgrade stays ours without renewal; a step takes far less.
pub const LEASE: Duration = Duration::from_secs(30);
/// How often a fleet upgrade with tenants moving is looked at. The end of one of its tenants'
/// upgrades makes it due at once (`inventory::fleet_due_now`); this poll covers what
/// nothing announces (a maintenance window opening, a tenant becoming startable).
pub const POLL: Duration = Duration::from_secs(2);

/// Steps fleet upgrades until the process ends.
pub async fn run(
    inv: Inventory,
    config: Arc<Config>,
    id: String,
    wake: Arc<Notify>,
    metrics: Arc<Metrics>,
) {
    let actor = format!("fleet/{id}");
    loop {
        let notified = wake.notified();
        match step_one(&inv, &config, &id, &actor).await {
            // Something was due: look again at once (another may be due too).
            Ok(Some(started)) => {
                metrics.fleet_step(started, None);
                continue;
            }
            Ok(None) => {}
            Err(e) => {
                metrics.fleet_step(0, Some(e.variant()));
                tracing::warn!(worker = %id, error = %e.public(), "fleet step failed");
            }
        }
        let _ = tokio::time::timeout(POLL, notified).await;
    }
}

/// Claims one due fleet upgrade and steps it: how many tenants it started, `None` when none
/// was due.
#[tracing::instrument(skip_all, fields(worker = %worker))]
pub async fn step_one(
    inv: &Inventory,
    config: &Config,
    worker: &str,
    actor: &str,
) -> Result<Option<usize>> {
    let Some(f) = inv.claim_fleet(worker, LEASE).await? else {
        return Ok(None);
    };
    let result = step_claimed(inv, config, &f, worker, actor).await;
    // Due again after the step's own wake-up time, or the poll: a finished fleet upgrade
    // with nothing moving is never claimed again.
    let after = match &result {
        Ok((Some(at), _)) => {
            let secs = (*at - OffsetDateTime::now_utc()).as_seconds_f64().max(0.0);
            Duration::from_secs_f64(secs).min(POLL)
        }
        _ => POLL,
    };
    inv.release_fleet(f.id, worker, after).await?;
    result.map(|(_, started)| Some(started))
}

async fn step_claimed(
    inv: &Inventory,
    config: &Config,
    f: &FleetRow,
    worker: &str,
    actor: &str,
) -> Result<(Option<OffsetDateTime>, usize)> {
    let rows = inv.fleet_entries(f.id).await?;
    let entries: Vec<Entry> = rows.iter().map(|r| entry(&config.plans, r)).collect();
    let pace = Pace {
        max_parallel: u32::try_from(f.max_parallel).unwrap_or(1),
        failure_budget: u32::try_from(f.failure_budget).unwrap_or(0),
        soak: Duration::from_secs(u64::try_from(f.soak_seconds).unwrap_or(0)),
        respect_windows: f.respect_maintenance_windows,
    };
    let now = OffsetDateTime::now_utc();
    let s = fleet::step(&f.progress(), &pace, &entries, now);
    // A hold is written once, when its reason is new to the entry (by id: one look per hold).
    let stored: std::collections::HashMap<i64, Option<&str>> = rows
        .iter()
        .map(|r| (r.tenant_id, r.reason.as_deref()))
        .collect();
    let new_holds = s
        .waiting
        .iter()
        .any(|(t, why)| stored.get(t).is_some_and(|r| *r != Some(why.as_str())));
    if !s.finished.is_empty() || s.progress != f.progress() || new_holds {
        if !inv.record_fleet_step(f, worker, &s, actor).await? {
            tracing::warn!(
                fleet_upgrade = f.id,
                "fleet lease lost; another worker steps it now"
            );
            return Ok((None, 0));
        }
        for (tenant, state, why) in &s.finished {
            tracing::info!(fleet_upgrade = f.id, tenant, state = %state, reason = ?why, "fleet entry finished");
        }
        if s.progress.state != f.state || s.progress.current_wave != f.current_wave as u32 {
            tracing::info!(fleet_upgrade = f.id, state = %s.progress.state, wave = s.progress.current_wave, reason = ?s.progress.reason, "fleet upgrade moved on");
        }
    }
    if s.progress.state != FleetState::Running {
        return Ok((s.wake_at, 0));
    }
    let mut started = 0;
    for tenant in &s.start {
        let Some(r) = rows.iter().find(|r| r.tenant_id == *tenant) else {
            continue;
        };
        let first_hop = match skew::plan_hops(
            &config.catalog,
            &r.from_version,
            &r.target_version,
            Allow {
                chain: r.chain,
                // Checked when the fleet upgrade was created; a target that became a
                // preview since is still the admin's choice.
                preview: true,
            },
        ) {
            Ok(hops) => hops[0].minor.clone(),
            Err(e) => {
                // The catalog changed since the plan: the entry is skipped with the rule
                // that refuses its hop now.
                let why = format!(
                    "the upgrade to {} is no longer allowed: {e}",
                    r.target_version
                );
                tracing::warn!(fleet_upgrade = f.id, tenant = %r.name, reason = %why, "fleet skipped a tenant");
                let skip = fleet::Step {
                    finished: vec![(r.tenant_id, FleetEntryState::Skipped, Some(why))],
                    start: Vec::new(),
                    waiting: Vec::new(),
                    // Unchanged from what the row had: only the entry is written.
                    progress: f.progress(),
                    wake_at: None,
                };
                if !inv.record_fleet_step(f, worker, &skip, actor).await? {
                    break;
                }
                continue;
            }
        };
        match inv
            .start_fleet_tenant(f.id, worker, r, &first_hop, actor)
            .await?
        {
            StartOutcome::Started(up) => {
                started += 1;
                tracing::info!(fleet_upgrade = f.id, tenant = %r.name, upgrade = up, from = %r.from_version, to = %r.target_version, "fleet started a tenant upgrade");
            }
            StartOutcome::Skipped(why) => {
                tracing::info!(fleet_upgrade = f.id, tenant = %r.name, reason = %why, "fleet skipped a tenant");
            }
            StartOutcome::Waiting(why) => {
                tracing::debug!(fleet_upgrade = f.id, tenant = %r.name, reason = %why, "tenant not startable yet");
            }
            StartOutcome::NotOurs => break,
        }
    }
    Ok((s.wake_at, started))
}

/// An entry as the step takes it: the tenant's own window, else its plan's.
fn entry(plans: &BTreeMap<String, Plan>, r: &FleetEntryRow) -> Entry {
    let window = r
        .maintenance_window
        .as_ref()
        .map(|w| w.0.clone())
        .or_else(|| {
            plans
                .get(&r.plan)
                .and_then(|p| p.maintenance_window.clone())
        });
    Entry {
        tenant_id: r.tenant_id,
        wave: u32::try_from(r.wave).unwrap_or(0),
        state: r.state,
        window,
        upgrade: r.upgrade_state.map(|s| (s, r.upgrade_reason.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::types::Json;
    use vcp_core::lifecycle::FleetEntryState;

    #[test]
    fn a_tenants_own_window_wins_over_its_plans() {
        let plans = crate::render::parse_plans(
            "gold: {maintenance_window: {days: [sun], start: \"03:00\", duration_minutes: 60}}\n",
        )
        .unwrap();
        let row = |plan: &str, own: Option<&str>| FleetEntryRow {
            tenant_id: 1,
            name: "a".into(),
            owner: "o".into(),
            plan: plan.into(),
            maintenance_window: own.map(|w| Json(w.parse().unwrap())),
            wave: 0,
            from_version: "1.36".into(),
            target_version: "1.37".into(),
            chain: false,
            forced: None,
            state: FleetEntryState::Pending,
            upgrade_id: None,
            reason: None,
            started_at: None,
            finished_at: None,
            upgrade_state: None,
            upgrade_reason: None,
        };
        let window = |r: FleetEntryRow| entry(&plans, &r).window.map(|w| w.to_string());
        assert_eq!(window(row("gold", None)).as_deref(), Some("sun 03:00 60m"));
        assert_eq!(
            window(row("gold", Some("sat 01:00 2h"))).as_deref(),
            Some("sat 01:00 120m")
        );
        assert_eq!(window(row("default", None)), None);
        assert!(
            crate::render::parse_plans(
                "x: {maintenance_window: {days: [], start: \"03:00\", duration_minutes: 60}}"
            )
            .is_err()
        );
    }
}
