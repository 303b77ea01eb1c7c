//! Which tenants are in use, told to vcp: sleep mode puts a tenant to sleep once nothing has
//! used its apiserver for a while, and the gateway is where that use is seen.
//!
//! Data flow: the proxy marks each routed connection's start and end in [`Activity`] (one map
//! update each), which also notes the tenant as *seen*. Every interval [`run`] takes the
//! tenants seen since the last report ([`Activity::take_seen`]: those that opened a connection
//! since, and those that still had one open at the last report), [`build`] turns them into a
//! report (`at`: now for a tenant with a connection open, else the wall-clock time of its last
//! activity) merged with what the last failed report could not deliver, and [`Vcp::report`]
//! sends it in chunks of at most [`MAX_REPORT`]. A chunk that fails is kept for the next
//! report, so a vcp restart or a network blip loses no activity. The work per report is
//! O(tenants seen), never O(routes): a gateway in front of many idle tenants reports little.
//!
//! [`build`] is pure (a snapshot and a clock in, the report out); only [`run`] does I/O.

use crate::metrics::Metrics;
use crate::route::TenantKey;
use crate::vcp::{MAX_REPORT, Seen, Vcp};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

/// When a tenant's apiserver was last wanted, and whether it is in use now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantActivity {
    /// When a connection for the tenant was last accepted or ended.
    pub last: Instant,
    /// Its connections open now (a `kubectl get -w` is one, for as long as it watches; a
    /// connection waiting for an asleep tenant to wake is one too).
    pub open: u32,
}

/// Per-tenant activity, shared by the proxy (which writes it on every routed connection's
/// start and end: one map update) and the reporter (which takes what was seen). Only tenants
/// with a route have an entry, and the entry goes with the route ([`Activity::forget`]).
#[derive(Debug, Clone, Default)]
pub struct Activity(Arc<Mutex<Inner>>);

#[derive(Debug, Default)]
struct Inner {
    tenants: HashMap<TenantKey, TenantActivity>,
    /// Tenants to name in the next report: a subset of `tenants`' keys.
    seen: HashSet<TenantKey>,
}

impl Activity {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every update is one statement per map; a poisoned lock still guards consistent maps.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A tenant's activity, if a connection for it was seen since its route appeared.
    pub fn get(&self, tenant: &str) -> Option<TenantActivity> {
        self.inner().tenants.get(tenant).copied()
    }

    /// Every tenant's activity.
    pub fn snapshot(&self) -> Vec<(TenantKey, TenantActivity)> {
        let inner = self.inner();
        inner.tenants.iter().map(|(n, a)| (n.clone(), *a)).collect()
    }

    /// Drops a tenant whose route went.
    pub fn forget(&self, tenant: &str) {
        let mut inner = self.inner();
        inner.tenants.remove(tenant);
        inner.seen.remove(tenant);
    }

    /// The tenants that had a connection open since the last call, with their activity now.
    /// Those with a connection still open stay seen: they are in use during the next interval
    /// too, whether or not another connection comes.
    pub fn take_seen(&self) -> Vec<(TenantKey, TenantActivity)> {
        let mut inner = self.inner();
        let seen = std::mem::take(&mut inner.seen);
        let mut out = Vec::with_capacity(seen.len());
        for key in seen {
            // Always there: forget drops a tenant from both maps.
            let Some(a) = inner.tenants.get(key.as_str()).copied() else {
                continue;
            };
            if a.open > 0 {
                inner.seen.insert(key.clone());
            }
            out.push((key, a));
        }
        out
    }

    pub(crate) fn opened(&self, tenant: &TenantKey) {
        let now = Instant::now();
        let mut inner = self.inner();
        match inner.tenants.get_mut(tenant.as_str()) {
            Some(a) => {
                a.last = now;
                a.open += 1;
            }
            None => {
                inner
                    .tenants
                    .insert(tenant.clone(), TenantActivity { last: now, open: 1 });
            }
        }
        // Cloning the key only the first time in an interval.
        if !inner.seen.contains(tenant.as_str()) {
            inner.seen.insert(tenant.clone());
        }
    }

    pub(crate) fn closed(&self, tenant: &str) {
        // Only an existing entry: a connection that outlives its route does not bring the
        // forgotten tenant back.
        if let Some(a) = self.inner().tenants.get_mut(tenant) {
            a.last = Instant::now();
            a.open = a.open.saturating_sub(1);
        }
    }
}

/// One moment read from both clocks: the monotonic one [`TenantActivity::last`] is on, and
/// the wall clock vcp's API speaks.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    pub now: Instant,
    pub wall: SystemTime,
}

impl Clock {
    pub fn now() -> Clock {
        Clock {
            now: Instant::now(),
            wall: SystemTime::now(),
        }
    }

    /// The wall-clock time of `at`, an instant before now (`SystemTime::now() - at.elapsed()`).
    pub fn wall_of(&self, at: Instant) -> SystemTime {
        let ago = self.now.saturating_duration_since(at);
        self.wall.checked_sub(ago).unwrap_or(self.wall)
    }
}

/// The report of `seen` (from [`Activity::take_seen`]) and `carried` (what a failed report
/// could not deliver), at `clock`: a tenant with a connection open was active now, the others
/// at their last activity; a tenant in both gets the later time. One entry per key, sorted by
/// key.
pub fn build(
    seen: Vec<(TenantKey, TenantActivity)>,
    carried: Vec<Seen>,
    clock: &Clock,
) -> Vec<Seen> {
    let mut by_key: HashMap<TenantKey, SystemTime> =
        carried.into_iter().map(|s| (s.key, s.at)).collect();
    for (key, a) in seen {
        let at = if a.open > 0 {
            clock.wall
        } else {
            clock.wall_of(a.last)
        };
        by_key
            .entry(key)
            .and_modify(|t| *t = (*t).max(at))
            .or_insert(at);
    }
    let mut report: Vec<Seen> = by_key
        .into_iter()
        .map(|(key, at)| Seen { key, at })
        .collect();
    report.sort_unstable_by(|a, b| a.key.cmp(&b.key));
    report
}

/// Sends one report of what `activity` saw since the last, with `carried`; what must be
/// carried to the next (the chunks that failed). Nothing is sent when there is nothing to say.
pub async fn report_once(
    vcp: &Vcp,
    activity: &Activity,
    metrics: &Metrics,
    carried: Vec<Seen>,
) -> Vec<Seen> {
    let report = build(activity.take_seen(), carried, &Clock::now());
    let mut kept = Vec::new();
    for chunk in report.chunks(MAX_REPORT) {
        match vcp.report(chunk).await {
            Ok(moved) => {
                metrics.activity_report(true);
                tracing::debug!(tenants = chunk.len(), moved, "activity reported");
            }
            Err(error) => {
                metrics.activity_report(false);
                let token = matches!(error, crate::Error::VcpToken { .. });
                let (tenants, error) = (chunk.len(), vcp_core::chain(&error));
                if token {
                    tracing::error!(
                        tenants,
                        error,
                        "activity report refused: check the gateway's vcp token; keeping it for the next report"
                    );
                } else {
                    tracing::warn!(
                        tenants,
                        error,
                        "activity report failed; keeping it for the next report"
                    );
                }
                kept.extend_from_slice(chunk);
            }
        }
    }
    kept
}

/// Reports activity to vcp every `every` until the future is dropped.
pub async fn run(vcp: Vcp, activity: Activity, metrics: Arc<Metrics>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    // A report that took long is not followed by a burst of catch-up reports.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is at once, with nothing seen yet.
    tick.tick().await;
    let mut carried = Vec::new();
    loop {
        tick.tick().await;
        carried = report_once(&vcp, &activity, &metrics, carried).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> TenantKey {
        TenantKey::new(s).unwrap()
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// A clock at wall time 1000 s, and the instant that stands for it.
    fn clock() -> Clock {
        Clock {
            now: Instant::now() + Duration::from_secs(100),
            wall: at(1000),
        }
    }

    fn idle_since(clock: &Clock, secs_ago: u64) -> TenantActivity {
        TenantActivity {
            last: clock.now - Duration::from_secs(secs_ago),
            open: 0,
        }
    }

    #[test]
    fn activity_counts_open_connections_and_keeps_the_last_time() {
        let activity = Activity::default();
        assert_eq!(activity.get("a"), None);
        activity.opened(&name("a"));
        activity.opened(&name("a"));
        let first = activity.get("a").unwrap();
        assert_eq!(first.open, 2);
        activity.closed("a");
        let later = activity.get("a").unwrap();
        assert_eq!(later.open, 1);
        assert!(later.last >= first.last);
        activity.forget("a");
        activity.closed("a");
        assert_eq!(
            activity.get("a"),
            None,
            "a forgotten tenant is not brought back"
        );
        assert!(activity.snapshot().is_empty());
        assert!(activity.take_seen().is_empty(), "nor reported");
    }

    #[test]
    fn seen_is_every_tenant_with_a_connection_open_since_the_last_take() {
        let activity = Activity::default();
        activity.opened(&name("a"));
        activity.closed("a");
        activity.opened(&name("b"));
        activity.opened(&name("b"));
        let keys = |mut v: Vec<(TenantKey, TenantActivity)>| {
            v.sort_by(|x, y| x.0.cmp(&y.0));
            v.into_iter()
                .map(|(k, _)| k.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(keys(activity.take_seen()), ["a", "b"]);
        // b is still open: in use during the next interval too; a is not.
        assert_eq!(keys(activity.take_seen()), ["b"]);
        activity.closed("b");
        activity.closed("b");
        assert_eq!(keys(activity.take_seen()), ["b"], "open at the last take");
        assert!(activity.take_seen().is_empty());
        // Tenants never seen cost the reporter nothing.
        assert_eq!(activity.snapshot().len(), 2);
    }

    #[test]
    fn a_report_says_now_for_open_tenants_and_the_last_activity_for_the_others() {
        let clock = clock();
        let seen = vec![
            (name("b"), idle_since(&clock, 30)),
            (
                name("a"),
                TenantActivity {
                    last: clock.now - Duration::from_secs(500),
                    open: 1,
                },
            ),
        ];
        let report = build(seen, Vec::new(), &clock);
        assert_eq!(
            report,
            [
                Seen {
                    key: name("a"),
                    at: at(1000)
                },
                Seen {
                    key: name("b"),
                    at: at(970)
                },
            ]
        );
        assert!(build(Vec::new(), Vec::new(), &clock).is_empty());
    }

    #[test]
    fn a_failed_report_is_merged_into_the_next_keeping_the_later_time() {
        let clock = clock();
        let carried = vec![
            Seen {
                key: name("a"),
                at: at(900),
            },
            Seen {
                key: name("c"),
                at: at(950),
            },
            Seen {
                key: name("d"),
                at: at(999),
            },
        ];
        let seen = vec![
            (name("a"), idle_since(&clock, 10)),
            (name("d"), idle_since(&clock, 500)),
        ];
        let report = build(seen, carried, &clock);
        let got: Vec<(&str, SystemTime)> = report.iter().map(|s| (s.key.as_str(), s.at)).collect();
        assert_eq!(got, [("a", at(990)), ("c", at(950)), ("d", at(999))]);
    }

    #[test]
    fn a_wall_time_is_now_less_the_time_elapsed_and_never_after_now() {
        let clock = clock();
        assert_eq!(clock.wall_of(clock.now - Duration::from_secs(5)), at(995));
        assert_eq!(clock.wall_of(clock.now + Duration::from_secs(5)), at(1000));
    }
}
