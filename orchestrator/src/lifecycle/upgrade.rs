//! Upgrades of tenant control planes to another Kubernetes minor.
//!
//! Data flow: `PATCH /v1/tenants/{name}` checks a request against the skew rules ([`skew`]:
//! the hops, or a refusal naming its rule) and records an upgrade in the inventory with the
//! first hop, `Snapshotting`, and a pending etcd snapshot ([`crate::snapshots`]). From then on
//! the reconcile workers do the work: once the snapshot is taken the hop starts (the tenant's
//! version becomes the hop's end); a pass renders the control plane from the tenant's version as always
//! (so the components roll in step order, each gated on its rollout and the apiserver on
//! `/readyz`), then checks the upgrade's own gates (the tenant API answers a write, a canary
//! ConfigMap makes the round trip through the syncer to the host), and [`advance`] decides
//! what the pass means for the upgrade: wait, the next hop, done, or roll back to the hop's
//! start. The worker writes that [`Transition`] in the same transaction as the pass's outcome,
//! so a replica killed anywhere leaves an upgrade another replica continues from.
//!
//! [`super::fleet`] plans fleet upgrades (many tenants, in waves) on top of this, and
//! [`crate::upgrades::runner`] starts each tenant's upgrade through the same inventory path.
//!
//! Pure: no client, no pool.

use crate::lifecycle::skew;
use crate::lifecycle::steps::{REQUEUE_WAITING, Step, StepResult, Verdict};
use crate::render::catalog::Catalog;
use std::time::Duration;
use time::OffsetDateTime;
use vcp_core::lifecycle::{
    Condition, ConditionReason, ConditionStatus, ConditionType, Phase, UpgradeState,
};

/// The upgrade a tenant is in, as a pass needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Active {
    pub id: i64,
    pub target: String,
    pub chain: bool,
    pub hop_from: String,
    pub hop_to: String,
    /// The hop's releases (`None`: the catalog's release of the minor); a patch update is a
    /// hop inside one minor, from one release to another.
    pub hop_from_release: Option<String>,
    pub hop_to_release: Option<String>,
    pub hop_started_at: OffsetDateTime,
    pub state: UpgradeState,
    /// The snapshot taken before the current hop, as far as it got.
    pub snapshot: Option<HopSnapshot>,
}

/// The snapshot before a hop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HopSnapshot {
    Pending,
    Taken(i64),
    Failed(String),
}

/// What a pass means for an upgrade.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// Nothing yet: the snapshot, the hop (or the rollback) is still under way.
    Wait(String),
    /// The snapshot before the hop is taken: the hop starts (`tenants.version` becomes its end).
    StartHop,
    /// The snapshot could not be taken: the upgrade ends before anything changed.
    Abort(String),
    /// The hop passed its gates; the next one is snapshotted, then started.
    NextHop { from: String, to: String },
    /// The last hop passed its gates.
    Succeeded,
    /// A gate failed: roll back to the hop's start (`tenants.version` becomes it), and restore
    /// the snapshot taken before the hop when [`rollback_restore`] says the old version may
    /// not read what the new one wrote.
    RollBack {
        reason: String,
        /// The hop's snapshot to restore, with why.
        restore: Option<(i64, String)>,
    },
    /// The rollback is complete: the control plane is healthy on the hop's start again.
    RolledBack,
}

impl Transition {
    /// Whether the upgrade stays active after this transition.
    pub fn active(&self) -> bool {
        !matches!(
            self,
            Transition::Succeeded | Transition::RolledBack | Transition::Abort(_)
        )
    }
}

/// How long a hop may take from its start to passing every gate before it is rolled back.
pub const DEFAULT_HOP_TIMEOUT: Duration = Duration::from_secs(300);

/// What a pass over an upgrading tenant means: `results` are its bring-up steps (on the
/// version the tenant row names), `gate` the upgrade's own gates after them (`None` when the
/// steps did not all pass, so the gates were not checked).
pub fn advance(
    a: &Active,
    catalog: &Catalog,
    results: &[(Step, StepResult)],
    gate: Option<&StepResult>,
    now: OffsetDateTime,
    hop_timeout: Duration,
) -> Transition {
    let steps_ready =
        results.len() == Step::ALL.len() && results.iter().all(|(_, r)| *r == StepResult::Ready);
    let healthy = steps_ready && gate == Some(&StepResult::Ready);
    // What the pass waits on, for the condition and for the reason of a rollback.
    let waiting = results
        .iter()
        .find(|(_, r)| *r != StepResult::Ready)
        .map(|(s, r)| format!("{:?}: {}", s.condition_type(), describe(r)))
        .or_else(|| {
            gate.filter(|g| **g != StepResult::Ready)
                .map(|g| format!("gate: {}", describe(g)))
        })
        .unwrap_or_else(|| "checking".to_owned());
    let elapsed = now - a.hop_started_at;
    match a.state {
        UpgradeState::Snapshotting => {
            let why = |m: &str| format!("snapshot before hop {} -> {}: {m}", a.hop_from, a.hop_to);
            if let Some((s, StepResult::Fatal(m))) = results
                .iter()
                .find(|(_, r)| matches!(r, StepResult::Fatal(_)))
            {
                return Transition::Abort(why(&format!(
                    "{:?} cannot succeed: {m}",
                    s.condition_type()
                )));
            }
            match &a.snapshot {
                Some(HopSnapshot::Taken(_)) => return Transition::StartHop,
                Some(HopSnapshot::Failed(m)) => return Transition::Abort(why(m)),
                _ => {}
            }
            if elapsed > hop_timeout {
                return Transition::Abort(why(&format!(
                    "not taken after {}s: {waiting}",
                    hop_timeout.as_secs()
                )));
            }
            let doing = if steps_ready {
                "taking the etcd snapshot"
            } else {
                waiting.as_str()
            };
            Transition::Wait(why(doing))
        }
        UpgradeState::Running => {
            if let Some((s, StepResult::Fatal(m))) = results
                .iter()
                .find(|(_, r)| matches!(r, StepResult::Fatal(_)))
            {
                return roll_back(
                    a,
                    catalog,
                    format!(
                        "hop {} -> {}: {:?} cannot succeed: {m}",
                        a.hop_from,
                        a.hop_to,
                        s.condition_type()
                    ),
                );
            }
            if healthy {
                if a.hop_to == a.target {
                    return Transition::Succeeded;
                }
                let allow = skew::Allow {
                    chain: a.chain,
                    preview: true,
                };
                return match skew::plan_hops(catalog, &a.hop_to, &a.target, allow) {
                    Ok(hops) => Transition::NextHop {
                        from: a.hop_to.clone(),
                        to: hops[0].minor.clone(),
                    },
                    // The catalog changed under the upgrade: stop where the tenant is
                    // healthy rather than guess.
                    Err(e) => roll_back(
                        a,
                        catalog,
                        format!(
                            "the next hop from {} to {} is no longer allowed: {e}",
                            a.hop_to, a.target
                        ),
                    ),
                };
            }
            if elapsed > hop_timeout {
                return roll_back(
                    a,
                    catalog,
                    format!(
                        "hop {} -> {} not healthy after {}s: {waiting}",
                        a.hop_from,
                        a.hop_to,
                        hop_timeout.as_secs()
                    ),
                );
            }
            Transition::Wait(format!("hop {} -> {}: {waiting}", a.hop_from, a.hop_to))
        }
        UpgradeState::RollingBack => {
            if steps_ready {
                Transition::RolledBack
            } else {
                Transition::Wait(format!("rolling back to {}: {waiting}", a.hop_from))
            }
        }
        // Finished upgrades are not passed here; nothing to do.
        UpgradeState::Succeeded | UpgradeState::RolledBack => Transition::Wait(String::new()),
    }
}

/// Why rolling back a hop must also restore the etcd snapshot taken before it, or `None` when
/// returning to the old images is enough. `from` and `to` are the hop's ends as (minor,
/// release; `None`: the catalog's release of the minor). The old version may not read what
/// the new one wrote when the hop moved etcd (its data files are the new release's), or when
/// the hop enters a minor the catalog marks `storage_change` (its apiserver stores some
/// resource in a version the old one cannot decode; a patch update inside that minor does not
/// enter it). A minor the catalog no longer knows counts as a change: nothing says the old
/// version can read its data, and a restore only loses the writes of the failed hop.
pub fn rollback_restore(
    catalog: &Catalog,
    from: (&str, Option<&str>),
    to: (&str, Option<&str>),
) -> Option<String> {
    let (Some(f), Some(t)) = (
        catalog.at_release(from.0, from.1),
        catalog.at_release(to.0, to.1),
    ) else {
        return Some(format!(
            "the catalog no longer describes the hop {} -> {}",
            from.0, to.0
        ));
    };
    if skew::rollout(&f, &t).contains(&crate::render::Component::Etcd) {
        let image = |v: &crate::render::Version| v.images.get("etcd").cloned().unwrap_or_default();
        return Some(format!(
            "the hop moved etcd from {} to {}",
            image(&f),
            image(&t)
        ));
    }
    (t.storage_change && f.minor != t.minor).then(|| {
        format!(
            "{} changes how the apiserver stores data (catalog: storage_change)",
            t.minor
        )
    })
}

/// The rollback of the current hop, with its snapshot restored when [`rollback_restore`]
/// says so and the snapshot was taken (a hop only runs once it was).
fn roll_back(a: &Active, catalog: &Catalog, reason: String) -> Transition {
    let restore = match (
        &a.snapshot,
        rollback_restore(
            catalog,
            (&a.hop_from, a.hop_from_release.as_deref()),
            (&a.hop_to, a.hop_to_release.as_deref()),
        ),
    ) {
        (Some(HopSnapshot::Taken(id)), Some(why)) => Some((*id, why)),
        _ => None,
    };
    Transition::RollBack { reason, restore }
}

/// What a transition makes of a pass's verdict: the phase is `Upgrading` while the upgrade is
/// active, the `Upgraded` condition says where it is, and a transition that changes the
/// version makes the tenant due again at once.
pub fn verdict(v: &mut Verdict, tr: &Transition, prev: &[Condition], now: OffsetDateTime) {
    use ConditionReason as R;
    use ConditionStatus as S;
    let (status, reason, message) = match tr {
        Transition::Wait(m) => (S::False, R::Waiting, m.clone()),
        Transition::StartHop => (
            S::False,
            R::Waiting,
            "snapshot taken; rolling the hop".to_owned(),
        ),
        Transition::Abort(m) => (S::False, R::Failed, format!("not started: {m}")),
        Transition::NextHop { from, to } => (
            S::False,
            R::Waiting,
            format!("{from} passed its gates; snapshotting before {to}"),
        ),
        Transition::Succeeded => (S::True, R::Ready, "upgraded".to_owned()),
        Transition::RollBack { reason, restore } => (
            S::False,
            R::Error,
            match restore {
                None => format!("rolling back: {reason}"),
                Some((id, why)) => {
                    format!("rolling back and restoring snapshot {id} ({why}): {reason}")
                }
            },
        ),
        Transition::RolledBack => (
            S::False,
            R::Failed,
            "rolled back to the version before the failed hop; the upgrade's reason says why"
                .to_owned(),
        ),
    };
    let last = prev
        .iter()
        .find(|c| c.type_ == ConditionType::Upgraded && c.status == status)
        .map_or(now, |c| c.last_transition_time);
    v.conditions.retain(|c| c.type_ != ConditionType::Upgraded);
    v.conditions.push(Condition {
        type_: ConditionType::Upgraded,
        status,
        reason,
        message,
        last_transition_time: last,
    });
    if tr.active() {
        v.phase = Phase::Upgrading;
        v.requeue_after = match tr {
            Transition::Wait(_) => v.requeue_after.min(REQUEUE_WAITING),
            _ => Duration::ZERO,
        };
    }
}

fn describe(r: &StepResult) -> &str {
    match r {
        StepResult::Ready => "ready",
        StepResult::Waiting(m) | StepResult::Error(m) | StepResult::Fatal(m) => m,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> OffsetDateTime {
        OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).unwrap()
    }

    fn active(from: &str, to: &str, target: &str, state: UpgradeState) -> Active {
        Active {
            id: 1,
            target: target.into(),
            chain: true,
            hop_from: from.into(),
            hop_to: to.into(),
            hop_from_release: None,
            hop_to_release: None,
            hop_started_at: at("2026-01-01T00:00:00Z"),
            state,
            snapshot: Some(HopSnapshot::Taken(9)),
        }
    }

    fn all_ready() -> Vec<(Step, StepResult)> {
        Step::ALL.iter().map(|s| (*s, StepResult::Ready)).collect()
    }

    fn stuck_at(step: Step, r: StepResult) -> Vec<(Step, StepResult)> {
        let mut out: Vec<_> = Step::ALL
            .iter()
            .take_while(|s| **s != step)
            .map(|s| (*s, StepResult::Ready))
            .collect();
        out.push((step, r));
        out
    }

    const T: Duration = DEFAULT_HOP_TIMEOUT;

    #[test]
    fn a_healthy_hop_moves_on_and_the_last_one_succeeds() {
        let c = Catalog::builtin();
        let now = at("2026-01-01T00:01:00Z");
        let ok = Some(&StepResult::Ready);
        let a = active("1.35", "1.36", "1.37", UpgradeState::Running);
        assert_eq!(
            advance(&a, &c, &all_ready(), ok, now, T),
            Transition::NextHop {
                from: "1.36".into(),
                to: "1.37".into()
            }
        );
        let a = active("1.36", "1.37", "1.37", UpgradeState::Running);
        assert_eq!(
            advance(&a, &c, &all_ready(), ok, now, T),
            Transition::Succeeded
        );
    }

    #[test]
    fn gates_and_steps_hold_a_hop_until_its_deadline_then_roll_it_back() {
        let c = Catalog::builtin();
        let a = active("1.36", "1.37", "1.37", UpgradeState::Running);
        let early = at("2026-01-01T00:04:59Z");
        let late = at("2026-01-01T00:05:01Z");
        let waiting = StepResult::Waiting("canary not on the host yet".into());
        // Steps ready, gate not yet.
        let t = advance(&a, &c, &all_ready(), Some(&waiting), early, T);
        assert!(
            matches!(&t, Transition::Wait(m) if m.contains("canary")),
            "{t:?}"
        );
        // A step not ready: the gates were not checked.
        let stuck = stuck_at(Step::Apiserver, StepResult::Waiting("0/1 ready".into()));
        let t = advance(&a, &c, &stuck, None, early, T);
        assert!(
            matches!(&t, Transition::Wait(m) if m.contains("ApiserverReady")),
            "{t:?}"
        );
        let t = advance(&a, &c, &stuck, None, late, T);
        assert!(
            matches!(&t, Transition::RollBack { reason: m, restore: None } if m.contains("1.36 -> 1.37") && m.contains("0/1 ready")),
            "{t:?}"
        );
        // A step that cannot succeed rolls back at once.
        let fatal = stuck_at(Step::Etcd, StepResult::Fatal("bad template".into()));
        let t = advance(&a, &c, &fatal, None, early, T);
        assert!(
            matches!(&t, Transition::RollBack { reason: m, .. } if m.contains("bad template")),
            "{t:?}"
        );
    }

    #[test]
    fn an_active_upgrade_shows_as_upgrading_and_a_finished_one_as_its_outcome() {
        let now = at("2026-01-01T00:01:00Z");
        let base = crate::lifecycle::steps::bring_up(&all_ready(), &[], now);
        assert_eq!(base.phase, Phase::Ready);
        let upgraded = |v: &Verdict| {
            v.conditions
                .iter()
                .find(|c| c.type_ == ConditionType::Upgraded)
                .cloned()
                .unwrap()
        };
        let mut v = base.clone();
        verdict(
            &mut v,
            &Transition::Wait("hop 1.36 -> 1.37: x".into()),
            &[],
            now,
        );
        assert_eq!(v.phase, Phase::Upgrading);
        assert!(v.requeue_after <= REQUEUE_WAITING);
        assert_eq!(upgraded(&v).status, ConditionStatus::False);
        let mut v = base.clone();
        verdict(
            &mut v,
            &Transition::RollBack {
                reason: "gate".into(),
                restore: None,
            },
            &[],
            now,
        );
        assert_eq!(
            (v.phase, v.requeue_after),
            (Phase::Upgrading, Duration::ZERO)
        );
        let mut v = base.clone();
        verdict(&mut v, &Transition::Succeeded, &[], now);
        assert_eq!(v.phase, Phase::Ready);
        assert_eq!(upgraded(&v).status, ConditionStatus::True);
        let mut v = base.clone();
        verdict(&mut v, &Transition::RolledBack, &[], now);
        assert_eq!(v.phase, Phase::Ready);
        assert_eq!(upgraded(&v).reason, ConditionReason::Failed);
    }

    #[test]
    fn a_hop_starts_only_after_its_snapshot_and_a_failed_snapshot_changes_nothing() {
        let c = Catalog::builtin();
        let early = at("2026-01-01T00:01:00Z");
        let late = at("2026-01-01T00:05:01Z");
        let mut a = active("1.36", "1.37", "1.37", UpgradeState::Snapshotting);
        a.snapshot = Some(HopSnapshot::Pending);
        let t = advance(&a, &c, &all_ready(), None, early, T);
        assert!(
            matches!(&t, Transition::Wait(m) if m.contains("taking the etcd snapshot")),
            "{t:?}"
        );
        assert!(
            matches!(advance(&a, &c, &all_ready(), None, late, T), Transition::Abort(m) if m.contains("not taken after 300s"))
        );
        let fatal = stuck_at(Step::Etcd, StepResult::Fatal("bad template".into()));
        assert!(
            matches!(advance(&a, &c, &fatal, None, early, T), Transition::Abort(m) if m.contains("bad template"))
        );
        a.snapshot = Some(HopSnapshot::Failed("claim full".into()));
        let t = advance(&a, &c, &all_ready(), None, early, T);
        assert!(
            matches!(&t, Transition::Abort(m) if m.contains("1.36 -> 1.37") && m.contains("claim full")),
            "{t:?}"
        );
        assert!(!t.active());
        a.snapshot = Some(HopSnapshot::Taken(3));
        assert_eq!(
            advance(&a, &c, &all_ready(), None, early, T),
            Transition::StartHop
        );
        let now = at("2026-01-01T00:01:00Z");
        let mut v = crate::lifecycle::steps::bring_up(&all_ready(), &[], now);
        verdict(&mut v, &Transition::Abort("x".into()), &[], now);
        assert_eq!(
            v.phase,
            Phase::Ready,
            "an aborted upgrade leaves the tenant as it was"
        );
    }

    #[test]
    fn a_rollback_ends_when_the_old_version_is_healthy_again() {
        let c = Catalog::builtin();
        let a = active("1.36", "1.37", "1.37", UpgradeState::RollingBack);
        let now = at("2026-01-01T01:00:00Z");
        // No deadline for a rollback, and its gates are the steps alone.
        let stuck = stuck_at(Step::ControllerManager, StepResult::Waiting("0/1".into()));
        assert!(matches!(
            advance(&a, &c, &stuck, None, now, T),
            Transition::Wait(_)
        ));
        assert_eq!(
            advance(&a, &c, &all_ready(), None, now, T),
            Transition::RolledBack
        );
    }

    #[test]
    fn a_catalog_that_lost_the_next_hop_stops_the_chain_where_it_is_healthy() {
        let ok = include_str!("../../../templates/versions.yaml");
        let c = Catalog::parse(
            &ok.replacen("class: supported", "class: expired", 2)
                .replacen("class: expired", "class: supported", 1),
        )
        .unwrap();
        assert_eq!(
            c.get("1.36").unwrap().class,
            crate::render::catalog::Class::Expired
        );
        // 1.35 -> 1.36 went fine, but 1.36 -> 1.37 is still allowed (leaving an expired minor).
        let a = active("1.35", "1.36", "1.37", UpgradeState::Running);
        let now = at("2026-01-01T00:01:00Z");
        let t = advance(&a, &c, &all_ready(), Some(&StepResult::Ready), now, T);
        assert_eq!(
            t,
            Transition::NextHop {
                from: "1.36".into(),
                to: "1.37".into()
            }
        );
        // A target that became expired ends the chain with a rollback of nothing new.
        let a = active("1.35", "1.36", "1.36", UpgradeState::Running);
        assert_eq!(
            advance(&a, &c, &all_ready(), Some(&StepResult::Ready), now, T),
            Transition::Succeeded
        );
    }

    #[test]
    fn a_rollback_restores_the_snapshot_only_when_the_old_version_may_not_read_the_data() {
        let ok = include_str!("../../../templates/versions.yaml");
        // Every built-in hop keeps etcd and its storage: the old images are enough.
        let c = Catalog::builtin();
        assert_eq!(rollback_restore(&c, ("1.36", None), ("1.37", None)), None);
        assert_eq!(rollback_restore(&c, ("1.35", None), ("1.36", None)), None);
        // The catalog marks 1.37 as a storage change.
        let marked = Catalog::parse(&ok.replacen(
            "controller_manager_flags: []",
            "controller_manager_flags: []\n    storage_change: true",
            1,
        ))
        .unwrap();
        assert!(marked.get("1.37").unwrap().storage_change);
        let why = rollback_restore(&marked, ("1.36", None), ("1.37", None)).unwrap();
        assert!(why.contains("storage_change"), "{why}");
        assert_eq!(
            rollback_restore(&marked, ("1.35", None), ("1.36", None)),
            None,
            "only the hop into the marked minor"
        );
        assert_eq!(
            rollback_restore(
                &marked,
                ("1.37", Some("v1.37.0")),
                ("1.37", Some("v1.37.1"))
            ),
            None,
            "a patch update inside the marked minor does not enter it"
        );
        // A hop that moves etcd.
        let moved = Catalog::parse(&ok.replacen("etcd:3.6.16-0", "etcd:3.7.0-0", 1)).unwrap();
        let why = rollback_restore(&moved, ("1.36", None), ("1.37", None)).unwrap();
        assert!(why.contains("3.6.16-0") && why.contains("3.7.0-0"), "{why}");
        // A hop the catalog no longer describes.
        assert!(rollback_restore(&c, ("1.34", None), ("1.35", None)).is_some());

        // The rollback carries the hop's snapshot when it must restore it, whatever failed.
        let now = at("2026-01-01T00:01:00Z");
        let late = at("2026-01-01T00:05:01Z");
        let a = active("1.36", "1.37", "1.37", UpgradeState::Running);
        let stuck = stuck_at(Step::Apiserver, StepResult::Waiting("0/1 ready".into()));
        let fatal = stuck_at(Step::Etcd, StepResult::Fatal("bad template".into()));
        for (results, at) in [(&stuck, late), (&fatal, now)] {
            match advance(&a, &marked, results, None, at, T) {
                Transition::RollBack {
                    restore: Some((9, why)),
                    ..
                } => assert!(why.contains("storage_change")),
                t => panic!("{t:?}"),
            }
            assert!(matches!(
                advance(&a, &c, results, None, at, T),
                Transition::RollBack { restore: None, .. }
            ));
        }
        // Without a taken snapshot there is nothing to restore (a hop never runs without one).
        let mut a = a;
        a.snapshot = None;
        assert!(matches!(
            advance(&a, &marked, &fatal, None, now, T),
            Transition::RollBack { restore: None, .. }
        ));
        // The condition says it restores.
        let mut v = crate::lifecycle::steps::bring_up(&all_ready(), &[], now);
        verdict(
            &mut v,
            &Transition::RollBack {
                reason: "gate".into(),
                restore: Some((9, "why".into())),
            },
            &[],
            now,
        );
        let c = v
            .conditions
            .iter()
            .find(|c| c.type_ == ConditionType::Upgraded)
            .unwrap();
        assert!(c.message.contains("restoring snapshot 9"), "{}", c.message);
    }
}
