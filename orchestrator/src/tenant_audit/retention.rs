//! Retention of the tenants' audit logs: events older than their tenant's plan keeps them
//! (`audit.retention_days`) are deleted.
//!
//! plans -> [`classes`] (one per distinct retention: the plans that keep events that long,
//! and a last class for plans no longer configured, at the default retention) -> one cutoff
//! each ([`cutoff`]) -> deletes of at most [`BATCH`] events at a time until none is left
//! ([`Inventory::delete_old_audit_events`], by the index on time). A sweep costs a few
//! statements per distinct retention, however many tenants there are; every replica sweeps,
//! and two sweeps at once delete disjoint or already deleted rows.

use crate::inventory::Inventory;
use crate::render::Plan;
use crate::render::audit::DEFAULT_RETENTION_DAYS;
use std::collections::BTreeMap;
use std::time::Duration;
use time::OffsetDateTime;

/// Most events one delete removes: short statements, so a large backlog never holds locks long.
pub const BATCH: u32 = 5_000;

/// One retention: the plans that keep events `days` days; `others`: plans not configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Class {
    pub days: u32,
    pub plans: Vec<String>,
    /// The class of tenants whose plan is none of `plans` (plans removed from the file since):
    /// they keep the default retention.
    pub others: bool,
}

/// The plans grouped by retention, then the class of plans not configured.
pub fn classes(plans: &BTreeMap<String, Plan>) -> Vec<Class> {
    let mut by_days: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for (name, p) in plans {
        by_days
            .entry(p.audit.retention_days)
            .or_default()
            .push(name.clone());
    }
    let mut out: Vec<Class> = by_days
        .into_iter()
        .map(|(days, plans)| Class {
            days,
            plans,
            others: false,
        })
        .collect();
    out.push(Class {
        days: DEFAULT_RETENTION_DAYS,
        plans: plans.keys().cloned().collect(),
        others: true,
    });
    out
}

/// Events at or before this are past a `days` retention at `now`.
pub fn cutoff(now: OffsetDateTime, days: u32) -> OffsetDateTime {
    now - time::Duration::days(i64::from(days))
}

/// One sweep: deletes every event past its retention; how many.
pub async fn sweep(
    inv: &Inventory,
    plans: &BTreeMap<String, Plan>,
    now: OffsetDateTime,
) -> crate::Result<u64> {
    let mut total = 0;
    for c in classes(plans) {
        let before = cutoff(now, c.days);
        loop {
            let n = inv
                .delete_old_audit_events(&c.plans, c.others, before, BATCH)
                .await?;
            total += n;
            if n < u64::from(BATCH) {
                break;
            }
        }
    }
    Ok(total)
}

/// Sweeps every `every`, forever.
pub async fn run(inv: Inventory, plans: BTreeMap<String, Plan>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match sweep(&inv, &plans, OffsetDateTime::now_utc()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                deleted = n,
                "tenant audit events past their retention deleted"
            ),
            Err(e) => tracing::warn!(error = %e.public(), "cannot delete old tenant audit events"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plans(yaml: &str) -> BTreeMap<String, Plan> {
        crate::render::parse_plans(yaml).unwrap()
    }

    #[test]
    fn plans_with_one_retention_share_a_class_and_unknown_plans_keep_the_default() {
        let c = classes(&plans(
            "short: {audit: {retention_days: 7}}\nweek: {audit: {retention_days: 7}}\nlong: {audit: {retention_days: 365}}\n",
        ));
        assert_eq!(
            c,
            vec![
                Class {
                    days: 7,
                    plans: vec!["short".into(), "week".into()],
                    others: false
                },
                Class {
                    days: 30,
                    plans: vec!["default".into()],
                    others: false
                },
                Class {
                    days: 365,
                    plans: vec!["long".into()],
                    others: false
                },
                Class {
                    days: 30,
                    plans: vec![
                        "default".into(),
                        "long".into(),
                        "short".into(),
                        "week".into()
                    ],
                    others: true
                },
            ]
        );
    }

    #[test]
    fn the_cutoff_is_exactly_the_retention_before_now() {
        let now = OffsetDateTime::from_unix_timestamp(1_772_366_400).unwrap();
        assert_eq!(
            cutoff(now, 30).unix_timestamp(),
            1_772_366_400 - 30 * 86_400
        );
        assert_eq!(cutoff(now, 1).unix_timestamp(), 1_772_366_400 - 86_400);
    }
}
