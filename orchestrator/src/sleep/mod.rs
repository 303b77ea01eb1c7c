//! Sleeping tenants: a control plane scaled to zero while nobody uses it.
//!
//! What is asked is the tenant's `sleep` (`awake` or `asleep`, [`Sleep`]), written by
//! `POST /v1/tenants/{name}/sleep` and `/wake` ([`api`]; `vcp tenant sleep|wake` in
//! `tenants::cli`), by the gateway's wake request when a
//! connection arrives for an asleep tenant, and by the idle sweep of each replica
//! ([`sweep`]): a tenant whose plan sets `sleep.after_idle_minutes` goes to sleep once the
//! gateway has reported no connection for it for that long ([`idle`], from `active_at`,
//! which the gateway's activity reports move) and it runs no workload on the host. The
//! tenant's passes do the rest (`crate::provision`'s sleep pass): every component rendered at
//! no replicas (`render::Run::Asleep`), etcd keeping its volume, the apiserver Service
//! annotated so the gateway knows to ask for a wake; phase `Sleeping` once no control-plane
//! pod is left. Waking is the ordinary bring-up, whose steps wait for each component as on
//! creation; the syncer rebuilds its state from the two apiservers, as after any restart.
//!
//! Workloads keep running while the control plane sleeps: they are what the tenant's users
//! reach, and the control plane is only needed to change them. So CoreDNS stays up while any
//! of the tenant's pods runs (serving what it last read), and the plan's idle sleep never
//! takes a tenant with running pods: an idle tenant's sleep costs no pod at all.

pub mod api;
pub mod store;
pub mod sweep;

use serde::{Deserialize, Serialize};
use std::time::Duration;
use time::OffsetDateTime;

pub use vcp_core::lifecycle::Sleep;

/// Longest idle time a plan may set: a week.
pub const MAX_IDLE_MINUTES: u32 = 7 * 24 * 60;

/// A plan's `sleep`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SleepPlan {
    /// Minutes without a connection through the gateway and without a running workload
    /// before the plan's tenants sleep (1 to [`MAX_IDLE_MINUTES`]).
    pub after_idle_minutes: u32,
}

impl SleepPlan {
    pub fn validate(&self) -> Result<(), String> {
        if (1..=MAX_IDLE_MINUTES).contains(&self.after_idle_minutes) {
            Ok(())
        } else {
            Err(format!(
                "sleep.after_idle_minutes must be 1 to {MAX_IDLE_MINUTES}, not {}",
                self.after_idle_minutes
            ))
        }
    }

    pub fn after(&self) -> Duration {
        Duration::from_secs(u64::from(self.after_idle_minutes) * 60)
    }
}

/// How long a tenant has been idle at `now`: since the gateway last reported a connection for
/// it, or since it was created if it never did. Zero for a time in the future (clocks of two
/// replicas disagree a little).
pub fn idle(
    now: OffsetDateTime,
    created_at: OffsetDateTime,
    active_at: Option<OffsetDateTime>,
) -> Duration {
    let since = active_at.map_or(created_at, |a| a.max(created_at));
    Duration::try_from(now - since).unwrap_or_default()
}

/// Whether the idle sweep puts an awake, Ready tenant to sleep: its plan sleeps tenants, it
/// has been idle for the plan's time, and none of its pods runs on the host.
pub fn due(plan: Option<&SleepPlan>, idle: Duration, running_pods: usize) -> bool {
    plan.is_some_and(|p| idle >= p.after() && running_pods == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn idle_time_runs_from_the_last_connection_or_the_creation() {
        let created = datetime!(2026-11-30 10:00 UTC);
        let now = datetime!(2026-11-30 10:30 UTC);
        assert_eq!(idle(now, created, None), Duration::from_secs(1800));
        assert_eq!(
            idle(now, created, Some(datetime!(2026-11-30 10:25 UTC))),
            Duration::from_secs(300)
        );
        // A report from a replica whose clock runs ahead: not idle, not negative.
        assert_eq!(
            idle(now, created, Some(datetime!(2026-11-30 10:31 UTC))),
            Duration::ZERO
        );
        // A report older than the tenant (a deleted namesake's): the creation counts.
        assert_eq!(
            idle(now, created, Some(datetime!(2026-11-30 09:00 UTC))),
            Duration::from_secs(1800)
        );
    }

    #[test]
    fn only_a_plan_that_sleeps_sleeps_an_idle_tenant_without_running_pods() {
        let plan = SleepPlan {
            after_idle_minutes: 10,
        };
        let ten = Duration::from_secs(600);
        assert!(due(Some(&plan), ten, 0));
        assert!(!due(Some(&plan), ten - Duration::from_secs(1), 0));
        assert!(
            !due(Some(&plan), ten * 6, 1),
            "a running pod keeps it awake"
        );
        assert!(!due(None, ten * 1000, 0), "no plan, no idle sleep");
    }

    #[test]
    fn plans_take_one_minute_to_a_week() {
        for ok in [1, 60, MAX_IDLE_MINUTES] {
            assert!(
                SleepPlan {
                    after_idle_minutes: ok
                }
                .validate()
                .is_ok()
            );
        }
        for bad in [0, MAX_IDLE_MINUTES + 1] {
            let e = SleepPlan {
                after_idle_minutes: bad,
            }
            .validate()
            .unwrap_err();
            assert!(e.contains("after_idle_minutes"), "{e}");
        }
        let parsed = crate::render::parse_plans("idle: {sleep: {after_idle_minutes: 0}}");
        assert!(
            parsed
                .unwrap_err()
                .to_string()
                .contains("after_idle_minutes")
        );
        let parsed = crate::render::parse_plans("idle: {sleep: {after_idle: 5}}");
        assert!(parsed.is_err(), "unknown keys are refused");
        let plans = crate::render::parse_plans("idle: {sleep: {after_idle_minutes: 15}}").unwrap();
        assert_eq!(
            plans["idle"].sleep.unwrap().after(),
            Duration::from_secs(900)
        );
        assert_eq!(plans["default"].sleep, None);
    }
}
