//! Scheduled backups and their retention: what is due and what has expired (pure, time
//! injected), and the sweep of `vcp serve` that acts on it ([`run`]).
//!
//! A plan's `backups: {hourly: N, daily: M}` asks for one snapshot per UTC hour and one per UTC
//! day, and keeps the newest N hourly and M daily ones (0 or absent: that schedule is off).
//! Data flow: every `--backup-sweep-seconds` each replica's sweep asks [`due`] which periods of
//! each Ready tenant of such a plan have no snapshot yet (only the current period: an hour the
//! platform was down is not made up later), records those `Pending` with their schedule and
//! period (a unique index on tenant, schedule and period makes replicas racing insert one row),
//! and the tenant's pass takes them as any other snapshot (uploaded, when a store is
//! configured). Then [`expired`] says which scheduled snapshots retention drops; the sweep
//! deletes each one's object, then marks the row pruned (in that order: a sweep killed between
//! the two deletes the object again, which is a no-op, and never leaves a row claiming an object
//! that is gone). Snapshots asked for through the API or by upgrades are never expired.

use crate::inventory::Inventory;
use crate::snapshots::offsite::{self, Store};
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::time::Duration;
use time::OffsetDateTime;
use vcp_core::lifecycle::SnapshotState;

pub use crate::backup_store::{BackupPlan, MAX_KEEP, Schedule};

/// A scheduled snapshot as retention sees it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Scheduled {
    pub id: i64,
    pub schedule: Schedule,
    pub scheduled_for: OffsetDateTime,
    pub state: SnapshotState,
    pub location: String,
}

/// The snapshots due now: each schedule the plan keeps any of whose current period has none
/// in `taken` (the tenant's scheduled snapshots, pruned ones too, of any state).
pub fn due(
    plan: &BackupPlan,
    now: OffsetDateTime,
    taken: &[Scheduled],
) -> Vec<(Schedule, OffsetDateTime)> {
    Schedule::ALL
        .into_iter()
        .filter(|&s| plan.keep(s) > 0)
        .map(|s| (s, s.period(now)))
        .filter(|&(s, p)| {
            !taken
                .iter()
                .any(|t| t.schedule == s && t.scheduled_for == p)
        })
        .collect()
}

/// The scheduled snapshots (not yet pruned) that retention drops: per schedule, newest period
/// first, everything after the newest `keep` taken ones, and every failed one but the newest
/// of its schedule (which shows why the last try failed). Pending ones never expire.
pub fn expired(plan: &BackupPlan, live: &[Scheduled]) -> Vec<i64> {
    let mut by: BTreeMap<Schedule, Vec<&Scheduled>> = BTreeMap::new();
    for s in live {
        by.entry(s.schedule).or_default().push(s);
    }
    let mut out = Vec::new();
    for (schedule, mut rows) in by {
        rows.sort_by_key(|r| std::cmp::Reverse((r.scheduled_for, r.id)));
        let keep = plan.keep(schedule) as usize;
        let (mut kept, mut newest_failure) = (0usize, true);
        for r in rows {
            match r.state {
                SnapshotState::Pending => {}
                SnapshotState::Succeeded if kept < keep => kept += 1,
                SnapshotState::Succeeded => out.push(r.id),
                SnapshotState::Failed if newest_failure && keep > 0 => newest_failure = false,
                SnapshotState::Failed => out.push(r.id),
            }
        }
    }
    out.sort_unstable();
    out
}

/// The scheduled snapshots of a deleted tenant that retention drops: as [`expired`]'s, and
/// every one older than what its schedule keeps, `keep` periods after its own (the longest a
/// live tenant's would be kept, with a newer one taken each period). So a deleted tenant's
/// backups stay restorable, through a clone, for its plan's retention, and then go.
pub fn expired_after_deletion(
    plan: &BackupPlan,
    live: &[Scheduled],
    now: OffsetDateTime,
) -> Vec<i64> {
    let mut out = expired(plan, live);
    for s in live {
        let period = match s.schedule {
            Schedule::Hourly => time::Duration::HOUR,
            Schedule::Daily => time::Duration::DAY,
        };
        if s.scheduled_for + period * plan.keep(s.schedule) <= now {
            out.push(s.id);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The sweep: every `interval`, asks for the due snapshots of every Ready tenant whose plan
/// schedules backups and prunes what expired of every tenant, deleted ones too (with
/// `store`, the objects too). Runs on every replica (see the module doc for why that is safe).
pub async fn run(
    inv: Inventory,
    config: std::sync::Arc<crate::host::Config>,
    store: Option<Store>,
    actor: String,
    interval: Duration,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = sweep(
            &inv,
            &config,
            store.as_ref(),
            &actor,
            OffsetDateTime::now_utc(),
        )
        .await
        {
            tracing::warn!(error = %e, "backup sweep failed; trying again next time");
        }
    }
}

/// A tenant's schedule: its own, else its plan's, else none.
fn effective(config: &crate::host::Config, plan: &str, own: Option<BackupPlan>) -> BackupPlan {
    own.or_else(|| config.plans.get(plan).and_then(|p| p.backups))
        .unwrap_or_default()
}

/// One sweep at `now`: each tenant on its own, so one that fails (its store unreachable, say)
/// holds up no other.
#[tracing::instrument(skip_all)]
pub async fn sweep(
    inv: &Inventory,
    config: &crate::host::Config,
    store: Option<&Store>,
    actor: &str,
    now: OffsetDateTime,
) -> Result<()> {
    for (tenant_id, plan_name, ready, own) in inv.backup_tenants().await? {
        let plan = effective(config, &plan_name, own.map(|j| j.0));
        if let Err(e) = sweep_tenant(inv, &plan, ready, tenant_id, store, actor, now).await {
            tracing::warn!(tenant_id, error = %e, "backup sweep of a tenant failed");
        }
    }
    for (tenant_id, plan_name, own) in inv.deleted_backup_tenants().await? {
        let plan = effective(config, &plan_name, own.map(|j| j.0));
        let pruned = async {
            let scheduled = inv.scheduled_snapshots(tenant_id).await?;
            let expired = expired_after_deletion(&plan, &scheduled, now);
            prune(inv, tenant_id, &scheduled, &expired, store, actor).await
        };
        if let Err(e) = pruned.await {
            tracing::warn!(tenant_id, error = %e, "backup sweep of a deleted tenant failed");
        }
    }
    Ok(())
}

async fn sweep_tenant(
    inv: &Inventory,
    plan: &BackupPlan,
    ready: bool,
    tenant_id: i64,
    store: Option<&Store>,
    actor: &str,
    now: OffsetDateTime,
) -> Result<()> {
    let scheduled = inv.scheduled_snapshots(tenant_id).await?;
    // Snapshots are asked for only of Ready tenants (an asleep one's would wait for it to
    // wake); retention applies to every live tenant.
    if ready {
        for (schedule, period) in due(plan, now, &scheduled) {
            if let Some(n) = inv
                .request_scheduled_snapshot(tenant_id, schedule, period, actor)
                .await?
            {
                tracing::info!(
                    tenant_id,
                    ?schedule,
                    snapshot = n,
                    "scheduled snapshot asked for"
                );
            }
        }
    }
    prune(
        inv,
        tenant_id,
        &scheduled,
        &expired(plan, &scheduled),
        store,
        actor,
    )
    .await
}

/// Deletes the objects of the snapshots `expired` names among a tenant's `scheduled`, then
/// marks each pruned.
async fn prune(
    inv: &Inventory,
    tenant_id: i64,
    scheduled: &[Scheduled],
    expired: &[i64],
    store: Option<&Store>,
    actor: &str,
) -> Result<()> {
    for &id in expired {
        let s = scheduled
            .iter()
            .find(|s| s.id == id)
            .expect("expired lists given rows");
        if inv.seeds_a_clone(id).await? {
            tracing::info!(
                tenant_id,
                snapshot_row = id,
                "expired backup kept until the clone made from it has restored it"
            );
            continue;
        }
        if let Some((bucket, key)) = offsite::parse_location(&s.location) {
            let Some(store) = store else {
                return Err(Error::Backup(format!(
                    "a snapshot to prune is in s3://{bucket} and no --backup-store is configured to delete it from"
                )));
            };
            store.delete(key).await?;
        }
        if inv.mark_pruned(tenant_id, id, actor).await? {
            tracing::info!(tenant_id, snapshot_row = id, schedule = ?s.schedule, "expired backup pruned");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    fn row(id: i64, s: Schedule, at: OffsetDateTime, state: SnapshotState) -> Scheduled {
        Scheduled {
            id,
            schedule: s,
            scheduled_for: at,
            state,
            location: format!("s3://vcp/k/snapshot-{id}.db.enc"),
        }
    }

    #[test]
    fn a_deleted_tenants_backups_go_once_their_retention_has_passed() {
        use SnapshotState::*;
        let plan = BackupPlan {
            hourly: 2,
            daily: 3,
        };
        let now = datetime!(2026-03-04 15:30 UTC);
        let rows = [
            row(
                1,
                Schedule::Hourly,
                datetime!(2026-03-04 14:00 UTC),
                Succeeded,
            ),
            row(
                2,
                Schedule::Hourly,
                datetime!(2026-03-04 13:00 UTC),
                Succeeded,
            ),
            row(
                3,
                Schedule::Daily,
                datetime!(2026-03-02 00:00 UTC),
                Succeeded,
            ),
            row(
                4,
                Schedule::Daily,
                datetime!(2026-03-01 00:00 UTC),
                Succeeded,
            ),
        ];
        // A live tenant keeps them all (two hourly, three daily at most).
        assert_eq!(expired(&plan, &rows), Vec::<i64>::new());
        // Deleted: 13:00 + 2 h has passed, 14:00 + 2 h not yet; 03-01 + 3 days has passed.
        assert_eq!(expired_after_deletion(&plan, &rows, now), [2, 4]);
        assert_eq!(
            expired_after_deletion(&plan, &rows, datetime!(2026-03-06 00:00 UTC)),
            [1, 2, 3, 4]
        );
        // A schedule the plan no longer keeps goes at once, as for a live tenant.
        let off = BackupPlan {
            hourly: 0,
            daily: 3,
        };
        assert_eq!(expired_after_deletion(&off, &rows, now), [1, 2, 4]);
    }

    #[test]
    fn periods_are_utc_hours_and_days() {
        let t = datetime!(2026-03-04 17:42:09.5 +02:00);
        assert_eq!(Schedule::Hourly.period(t), datetime!(2026-03-04 15:00 UTC));
        assert_eq!(Schedule::Daily.period(t), datetime!(2026-03-04 00:00 UTC));
        let midnight = datetime!(2026-03-05 00:00 UTC);
        assert_eq!(Schedule::Daily.period(midnight), midnight);
    }

    #[test]
    fn the_current_period_is_due_once_per_kept_schedule() {
        use SnapshotState::*;
        let now = datetime!(2026-03-04 15:30 UTC);
        let plan = BackupPlan {
            hourly: 3,
            daily: 0,
        };
        assert_eq!(
            due(&plan, now, &[]),
            [(Schedule::Hourly, datetime!(2026-03-04 15:00 UTC))]
        );
        // Taken (in any state, pruned or not): not due again.
        for state in [Pending, Succeeded, Failed] {
            let taken = [row(
                1,
                Schedule::Hourly,
                datetime!(2026-03-04 15:00 UTC),
                state,
            )];
            assert_eq!(due(&plan, now, &taken), []);
        }
        // The previous hour's does not count for this one; a missed hour is not made up.
        let taken = [row(
            1,
            Schedule::Hourly,
            datetime!(2026-03-04 13:00 UTC),
            Succeeded,
        )];
        assert_eq!(due(&plan, now, &taken).len(), 1);
        let both = BackupPlan {
            hourly: 1,
            daily: 7,
        };
        assert_eq!(
            due(&both, now, &taken),
            [
                (Schedule::Hourly, datetime!(2026-03-04 15:00 UTC)),
                (Schedule::Daily, datetime!(2026-03-04 00:00 UTC)),
            ]
        );
        assert_eq!(due(&BackupPlan::default(), now, &[]), []);
    }

    #[test]
    fn retention_drops_exactly_what_is_past_the_newest_n() {
        use SnapshotState::*;
        let h = |n: i64| datetime!(2026-03-04 00:00 UTC) + time::Duration::hours(n);
        let live = [
            row(1, Schedule::Hourly, h(1), Succeeded),
            row(2, Schedule::Hourly, h(2), Failed),
            row(3, Schedule::Hourly, h(3), Succeeded),
            row(4, Schedule::Hourly, h(4), Succeeded),
            row(5, Schedule::Hourly, h(5), Failed),
            row(6, Schedule::Hourly, h(6), Pending),
            row(7, Schedule::Daily, h(0), Succeeded),
            row(
                8,
                Schedule::Daily,
                h(0) - time::Duration::days(1),
                Succeeded,
            ),
        ];
        let plan = BackupPlan {
            hourly: 2,
            daily: 2,
        };
        // Hourly keeps 4 and 3 (the newest two taken), the newest failure (5) and the pending
        // one; drops 1 and the older failure; daily keeps both.
        assert_eq!(expired(&plan, &live), [1, 2]);
        let plan = BackupPlan {
            hourly: 2,
            daily: 1,
        };
        assert_eq!(expired(&plan, &live), [1, 2, 8]);
        // A schedule turned off drops all of its own, pending ones aside.
        let plan = BackupPlan {
            hourly: 0,
            daily: 0,
        };
        assert_eq!(expired(&plan, &live), [1, 2, 3, 4, 5, 7, 8]);
        // Keeping more than there are drops only the older failure.
        let plan = BackupPlan {
            hourly: 100,
            daily: 100,
        };
        assert_eq!(expired(&plan, &live), [2]);
        // The order rows come in does not matter.
        let mut rev = live.to_vec();
        rev.reverse();
        assert_eq!(
            expired(
                &BackupPlan {
                    hourly: 2,
                    daily: 1
                },
                &rev
            ),
            [1, 2, 8]
        );
    }

    #[test]
    fn a_plan_keeps_at_most_max_keep() {
        assert!(
            BackupPlan {
                hourly: MAX_KEEP,
                daily: 0
            }
            .validate()
            .is_ok()
        );
        assert!(
            BackupPlan {
                hourly: 0,
                daily: MAX_KEEP + 1
            }
            .validate()
            .is_err()
        );
        let p: BackupPlan = serde_yaml::from_str("{hourly: 3}").unwrap();
        assert_eq!(
            p,
            BackupPlan {
                hourly: 3,
                daily: 0
            }
        );
        assert!(serde_yaml::from_str::<BackupPlan>("{weekly: 3}").is_err());
    }
}
