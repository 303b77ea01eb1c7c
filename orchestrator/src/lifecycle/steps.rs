//! The provisioning steps and what their results mean for a tenant (pure).
//!
//! Bring-up is a graph, not a ladder: each step runs once the steps it takes its inputs from
//! allow it ([`action`]), so on a first start etcd and the apiserver are applied together, and
//! the controller-manager, CoreDNS and the syncer as soon as the apiserver answers, while a
//! control plane that already serves changes one component only after the one before it is
//! rolled out (etcd before the apiserver before its clients: rolls stay ordered during
//! rotations and versions stay within skew during upgrades). A pass walks the graph from the
//! start (every step is idempotent, so repeating a finished one costs a few no-op applies),
//! reads each component's readiness, and turns what it saw into conditions and a phase. That
//! is what lets any replica resume any tenant from any point.

use std::collections::BTreeMap;
use std::time::Duration;
use time::OffsetDateTime;
use vcp_core::lifecycle::{Condition, ConditionReason, ConditionStatus, ConditionType, Phase};

/// Bring-up steps, in the order of their conditions (the order their inputs flow in). The
/// name is the condition type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    Namespace,
    Exposed,
    Certificates,
    Etcd,
    Apiserver,
    Bootstrapped,
    ControllerManager,
    Dns,
    Syncer,
}

impl Step {
    pub const ALL: [Step; 9] = [
        Step::Namespace,
        Step::Exposed,
        Step::Certificates,
        Step::Etcd,
        Step::Apiserver,
        Step::Bootstrapped,
        Step::ControllerManager,
        Step::Dns,
        Step::Syncer,
    ];

    pub fn condition_type(self) -> ConditionType {
        match self {
            Step::Namespace => ConditionType::NamespaceReady,
            Step::Exposed => ConditionType::Exposed,
            Step::Certificates => ConditionType::CertificatesReady,
            Step::Etcd => ConditionType::EtcdReady,
            Step::Apiserver => ConditionType::ApiserverReady,
            Step::Bootstrapped => ConditionType::Bootstrapped,
            Step::ControllerManager => ConditionType::ControllerManagerReady,
            Step::Dns => ConditionType::DnsReady,
            Step::Syncer => ConditionType::SyncerReady,
        }
    }
}

/// What a step reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepResult {
    Ready,
    /// Applied, not ready yet (why, for people).
    Waiting(String),
    /// Failed; retried after a back-off. The message must hold no secret.
    Error(String),
    /// Cannot succeed without someone changing the tenant or the configuration.
    Fatal(String),
}

/// The state a pass leaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub phase: Phase,
    pub conditions: Vec<Condition>,
    pub requeue_after: Duration,
}

/// Sets one condition of a verdict (replacing the one of its type).
pub fn set_condition(
    v: &mut Verdict,
    type_: ConditionType,
    status: ConditionStatus,
    reason: ConditionReason,
    message: &str,
    prev: &[Condition],
    now: OffsetDateTime,
) {
    v.conditions.retain(|c| c.type_ != type_);
    v.conditions
        .push(condition(type_, status, reason, message, prev, now));
}

/// A workload's rollout as its status reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rollout {
    /// Replicas asked for.
    pub want: i32,
    /// Ready (Deployments: available) pods, old and new.
    pub ready: i32,
    /// Pods of the current template.
    pub updated: i32,
    /// Every pod the controller counts, old and new.
    pub total: i32,
    pub observed: i64,
    pub generation: i64,
}

impl Rollout {
    /// What it still waits for; `None` when rolled out: the controller saw the latest spec,
    /// every pod is of the current template, and no old pod is left to answer in its place (a
    /// surge pod that cannot start must not pass behind an old one that still serves).
    pub fn waiting(&self) -> Option<String> {
        let Rollout {
            want,
            ready,
            updated,
            total,
            observed,
            generation,
        } = *self;
        let done = observed >= generation && updated >= want && ready >= want && total <= want;
        (!done).then(|| {
            let old = (total - updated).max(0);
            let mut m = format!("{ready}/{want} ready, {updated}/{want} updated");
            if old > 0 {
                m.push_str(&format!(", {old} old"));
            }
            m
        })
    }
}

/// What a pass does with one component of the control plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Render and apply it, then read its readiness.
    Apply,
    /// Only read its readiness: it exists, and changing it now would run ahead of the
    /// component it follows (a roll of etcd, an apiserver on another version).
    Check,
    /// Leave it alone: it does not exist yet and what it needs to start is not there either.
    Skip,
}

/// What to do with a component: apply it when the component it follows was applied in this
/// pass and is ready (`after_ready`), as the ladder always did; create it early when it does
/// not `exist` yet but what it needs to start does (`can_start`: for the apiserver its
/// certificates, for its clients an apiserver that answers). Nothing serves yet in that case,
/// so there is no roll to keep in order and no older version to stay within skew of, and
/// starting it before its predecessor is *ready* only saves time. A component that exists is
/// otherwise left as it is and only checked.
pub fn action(exists: bool, after_ready: bool, can_start: bool) -> Action {
    if after_ready || (!exists && can_start) {
        Action::Apply
    } else if exists {
        Action::Check
    } else {
        Action::Skip
    }
}

/// The apiserver's own answer to `GET /readyz`, as the orchestrator got it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readyz {
    /// The body (`ok` when ready).
    Answered(String),
    /// No answer (connection refused, TLS, timeout).
    Unreachable(String),
    /// Not asked: simulated control planes have no apiserver to ask.
    Simulated,
}

/// The apiserver step from its rollout and its `/readyz`, and whether it answers (what its
/// clients need to start). Ready takes both: rolled out (no old replica answering in its
/// place) and `/readyz` says `ok`.
pub fn apiserver(rollout: StepResult, readyz: &Readyz) -> (StepResult, bool) {
    let answers = match readyz {
        Readyz::Answered(body) => body.trim() == "ok",
        Readyz::Unreachable(_) => false,
        Readyz::Simulated => rollout == StepResult::Ready,
    };
    let result = match (rollout, readyz) {
        (StepResult::Ready, _) if answers => StepResult::Ready,
        (StepResult::Ready, Readyz::Answered(body)) => {
            StepResult::Waiting(format!("apiserver /readyz: {}", body.trim()))
        }
        (StepResult::Ready, Readyz::Unreachable(e)) => {
            StepResult::Waiting(format!("apiserver /readyz: {e}"))
        }
        (other, _) => other,
    };
    (result, answers)
}

/// How soon to look again.
pub const REQUEUE_WAITING: Duration = Duration::from_secs(2);
pub const REQUEUE_ERROR: Duration = Duration::from_secs(10);
pub const REQUEUE_FATAL: Duration = Duration::from_secs(300);
/// Ready tenants are re-checked (drift, certificate renewal) this often.
pub const REQUEUE_READY: Duration = Duration::from_secs(300);

pub(crate) fn condition(
    type_: ConditionType,
    status: ConditionStatus,
    reason: ConditionReason,
    message: &str,
    prev: &[Condition],
    now: OffsetDateTime,
) -> Condition {
    // The transition time moves only when the status does, as in Kubernetes.
    let last = prev
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or(now, |c| c.last_transition_time);
    Condition {
        type_,
        status,
        reason,
        message: message.to_owned(),
        last_transition_time: last,
    }
}

/// Conditions and phase after a bring-up pass that got as far as `results` (steps without a
/// result were not reached), as of `now`.
pub fn bring_up(
    results: &[(Step, StepResult)],
    prev: &[Condition],
    now: OffsetDateTime,
) -> Verdict {
    bring_up_seen(results, &BTreeMap::new(), prev, now)
}

/// [`bring_up`] with the time each step's result was known (`seen`; `now` for a step it does
/// not list): a condition that changes status takes that time, so a step's transition time is
/// when the pass saw it ready, not when the pass began. `Ready` takes the latest of them.
pub fn bring_up_seen(
    results: &[(Step, StepResult)],
    seen: &BTreeMap<Step, OffsetDateTime>,
    prev: &[Condition],
    now: OffsetDateTime,
) -> Verdict {
    use ConditionReason as R;
    use ConditionStatus as S;
    let mut conditions = Vec::new();
    let mut requeue = REQUEUE_READY;
    let mut phase = Phase::Ready;
    for step in Step::ALL {
        let t = step.condition_type();
        let now = seen.get(&step).copied().unwrap_or(now);
        let c = match results.iter().find(|(s, _)| *s == step).map(|(_, r)| r) {
            Some(StepResult::Ready) => condition(t, S::True, R::Ready, "", prev, now),
            Some(StepResult::Waiting(m)) => {
                requeue = REQUEUE_WAITING;
                phase = Phase::Provisioning;
                condition(t, S::False, R::Waiting, m, prev, now)
            }
            Some(StepResult::Error(m)) => {
                requeue = REQUEUE_ERROR;
                phase = Phase::Provisioning;
                condition(t, S::False, R::Error, m, prev, now)
            }
            Some(StepResult::Fatal(m)) => {
                requeue = REQUEUE_FATAL;
                phase = Phase::Failed;
                condition(t, S::False, R::Failed, m, prev, now)
            }
            None => {
                if phase == Phase::Ready {
                    phase = Phase::Provisioning;
                }
                condition(t, S::Unknown, R::NotReached, "", prev, now)
            }
        };
        conditions.push(c);
    }
    let ready = phase == Phase::Ready;
    let last = seen.values().copied().max().unwrap_or(now);
    conditions.push(condition(
        ConditionType::Ready,
        S::of(ready),
        if ready { R::Ready } else { R::Provisioning },
        "",
        prev,
        last,
    ));
    Verdict {
        phase,
        conditions,
        requeue_after: requeue,
    }
}

/// Conditions and phase during deletion.
pub fn tear_down(result: &StepResult, prev: &[Condition], now: OffsetDateTime) -> Verdict {
    use ConditionReason as R;
    use ConditionStatus as S;
    let (status, reason, message, requeue) = match result {
        StepResult::Ready => (S::True, R::Deleted, "", REQUEUE_WAITING),
        StepResult::Waiting(m) => (S::False, R::Waiting, m.as_str(), REQUEUE_WAITING),
        StepResult::Error(m) | StepResult::Fatal(m) => {
            (S::False, R::Error, m.as_str(), REQUEUE_ERROR)
        }
    };
    let mut conditions: Vec<Condition> = prev
        .iter()
        .filter(|c| c.type_ != ConditionType::Deleted)
        .cloned()
        .collect();
    conditions.push(condition(
        ConditionType::Deleted,
        status,
        reason,
        message,
        prev,
        now,
    ));
    Verdict {
        // Done: everything is gone, the worker tombstones the row.
        phase: if *result == StepResult::Ready {
            Phase::Deleted
        } else {
            Phase::Deleting
        },
        conditions,
        requeue_after: requeue,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_790_000_000 + s).unwrap()
    }

    fn find<'a>(v: &'a Verdict, t: &str) -> &'a Condition {
        v.conditions.iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn a_pass_stopped_at_etcd_is_provisioning_with_later_steps_unknown() {
        let v = bring_up(
            &[
                (Step::Namespace, StepResult::Ready),
                (Step::Exposed, StepResult::Ready),
                (Step::Certificates, StepResult::Ready),
                (Step::Etcd, StepResult::Waiting("0/1 members ready".into())),
            ],
            &[],
            at(0),
        );
        assert_eq!(v.phase, "Provisioning");
        assert_eq!(v.requeue_after, REQUEUE_WAITING);
        assert_eq!(find(&v, "EtcdReady").status, "False");
        assert_eq!(find(&v, "EtcdReady").message, "0/1 members ready");
        assert_eq!(find(&v, "ApiserverReady").status, "Unknown");
        assert_eq!(find(&v, "Ready").status, "False");
        assert_eq!(v.conditions.len(), Step::ALL.len() + 1);
    }

    #[test]
    fn all_steps_ready_is_ready_and_transition_times_stay_put() {
        let all: Vec<_> = Step::ALL.iter().map(|s| (*s, StepResult::Ready)).collect();
        let first = bring_up(&all, &[], at(0));
        assert_eq!(first.phase, "Ready");
        assert_eq!(first.requeue_after, REQUEUE_READY);
        let again = bring_up(&all, &first.conditions, at(100));
        assert_eq!(
            again.conditions, first.conditions,
            "nothing changed, nothing moves"
        );
        let mut broken = all.clone();
        broken[8] = (Step::Syncer, StepResult::Error("boom".into()));
        let later = bring_up(&broken, &again.conditions, at(200));
        assert_eq!(later.phase, "Provisioning");
        assert_eq!(later.requeue_after, REQUEUE_ERROR);
        assert_eq!(find(&later, "SyncerReady").last_transition_time, at(200));
        assert_eq!(find(&later, "EtcdReady").last_transition_time, at(0));
    }

    #[test]
    fn a_fatal_step_fails_the_tenant() {
        let v = bring_up(
            &[(Step::Namespace, StepResult::Fatal("unknown plan".into()))],
            &[],
            at(0),
        );
        assert_eq!(v.phase, "Failed");
        assert_eq!(v.requeue_after, REQUEUE_FATAL);
    }

    #[test]
    fn deletion_keeps_earlier_conditions_and_reports_progress() {
        let all: Vec<_> = Step::ALL.iter().map(|s| (*s, StepResult::Ready)).collect();
        let up = bring_up(&all, &[], at(0));
        let d = tear_down(
            &StepResult::Waiting("2 namespaces left".into()),
            &up.conditions,
            at(5),
        );
        assert_eq!(d.phase, "Deleting");
        assert_eq!(find(&d, "Deleted").status, "False");
        assert_eq!(find(&d, "EtcdReady").status, "True");
        let d2 = tear_down(&StepResult::Ready, &d.conditions, at(9));
        assert_eq!(
            d2.conditions
                .iter()
                .filter(|c| c.type_ == "Deleted")
                .count(),
            1
        );
    }

    #[test]
    fn a_finished_tear_down_ends_in_deleted_and_an_unfinished_one_keeps_deleting() {
        let d = tear_down(&StepResult::Ready, &[], at(0));
        assert_eq!(d.phase, Phase::Deleted);
        assert_eq!(find(&d, "Deleted").status, ConditionStatus::True);
        assert_eq!(find(&d, "Deleted").reason, ConditionReason::Deleted);
        for r in [
            StepResult::Waiting("1 left: vcp-k".into()),
            StepResult::Error("boom".into()),
            StepResult::Fatal("boom".into()),
        ] {
            assert_eq!(tear_down(&r, &[], at(0)).phase, Phase::Deleting, "{r:?}");
        }
    }

    #[test]
    fn a_first_start_creates_what_can_start_and_a_serving_plane_keeps_its_order() {
        // Nothing there yet: created as soon as what it needs exists, before its predecessor
        // is ready (etcd and the apiserver together; the apiserver's clients once it answers).
        assert_eq!(action(false, false, true), Action::Apply);
        // Not there and cannot start yet (no apiserver answers): left for a later pass.
        assert_eq!(action(false, false, false), Action::Skip);
        // There already: changed only behind a predecessor applied and ready in this pass,
        // so a roll of etcd or an upgrade's apiserver goes first; until then only read.
        assert_eq!(action(true, false, true), Action::Check);
        assert_eq!(action(true, false, false), Action::Check);
        assert_eq!(action(true, true, true), Action::Apply);
        assert_eq!(action(false, true, false), Action::Apply);
    }

    #[test]
    fn the_apiserver_answers_before_its_rollout_counts_and_is_ready_only_with_both() {
        let ok = Readyz::Answered("ok\n".into());
        let waiting = || StepResult::Waiting("0/1 ready, 1/1 updated".into());
        assert_eq!(apiserver(StepResult::Ready, &ok), (StepResult::Ready, true));
        // Its clients may start: it answers, though its own probe has not said so yet.
        assert_eq!(apiserver(waiting(), &ok), (waiting(), true));
        let (r, answers) = apiserver(
            StepResult::Ready,
            &Readyz::Answered("[-]etcd failed".into()),
        );
        assert!(!answers);
        assert_eq!(
            r,
            StepResult::Waiting("apiserver /readyz: [-]etcd failed".into())
        );
        let (r, answers) = apiserver(waiting(), &Readyz::Unreachable("refused".into()));
        assert_eq!((r, answers), (waiting(), false));
        assert_eq!(
            apiserver(StepResult::Ready, &Readyz::Unreachable("refused".into())).0,
            StepResult::Waiting("apiserver /readyz: refused".into())
        );
        // Simulated control planes: the rollout is all there is.
        assert_eq!(
            apiserver(StepResult::Ready, &Readyz::Simulated),
            (StepResult::Ready, true)
        );
        assert_eq!(apiserver(waiting(), &Readyz::Simulated), (waiting(), false));
        let e = StepResult::Error("read deployment".into());
        assert_eq!(apiserver(e.clone(), &ok), (e, true));
    }

    #[test]
    fn steps_ahead_of_a_waiting_one_keep_their_own_conditions() {
        // etcd's readiness lags (three reads in a row) while the apiserver already serves.
        let mut results: Vec<_> = Step::ALL.iter().map(|s| (*s, StepResult::Ready)).collect();
        results[3] = (Step::Etcd, StepResult::Waiting("0/1 ready".into()));
        let v = bring_up(&results, &[], at(0));
        assert_eq!(v.phase, Phase::Provisioning);
        assert_eq!(v.requeue_after, REQUEUE_WAITING);
        assert_eq!(find(&v, "EtcdReady").status, ConditionStatus::False);
        assert_eq!(find(&v, "ApiserverReady").status, ConditionStatus::True);
        assert_eq!(find(&v, "SyncerReady").status, ConditionStatus::True);
        assert_eq!(find(&v, "Ready").status, ConditionStatus::False);
    }

    #[test]
    fn a_condition_changes_at_the_time_its_step_was_seen() {
        let results = [
            (Step::Namespace, StepResult::Ready),
            (Step::Exposed, StepResult::Ready),
            (Step::Certificates, StepResult::Ready),
            (Step::Etcd, StepResult::Waiting("0/1 ready".into())),
        ];
        let seen = BTreeMap::from([
            (Step::Namespace, at(1)),
            (Step::Certificates, at(3)),
            (Step::Etcd, at(4)),
        ]);
        let v = bring_up_seen(&results, &seen, &[], at(0));
        assert_eq!(find(&v, "NamespaceReady").last_transition_time, at(1));
        assert_eq!(
            find(&v, "Exposed").last_transition_time,
            at(0),
            "not listed"
        );
        assert_eq!(find(&v, "CertificatesReady").last_transition_time, at(3));
        assert_eq!(find(&v, "EtcdReady").last_transition_time, at(4));
        assert_eq!(find(&v, "Ready").last_transition_time, at(4));
        // A later pass keeps the times of conditions whose status did not change.
        let again = bring_up_seen(
            &results,
            &BTreeMap::from([(Step::Etcd, at(9))]),
            &v.conditions,
            at(8),
        );
        assert_eq!(
            find(&again, "CertificatesReady").last_transition_time,
            at(3)
        );
        assert_eq!(find(&again, "EtcdReady").last_transition_time, at(4));
    }

    #[test]
    fn a_rollout_is_done_only_when_no_old_pod_is_left() {
        let r = |ready, updated, total| Rollout {
            want: 1,
            ready,
            updated,
            total,
            observed: 2,
            generation: 2,
        };
        assert_eq!(r(1, 1, 1).waiting(), None);
        // The surge pod is created (updated) but cannot start; the old one is the ready one.
        assert_eq!(
            r(1, 1, 2).waiting().as_deref(),
            Some("1/1 ready, 1/1 updated, 1 old")
        );
        assert!(r(0, 1, 1).waiting().is_some());
        assert!(r(1, 0, 1).waiting().is_some());
        let stale = Rollout {
            generation: 3,
            ..r(1, 1, 1)
        };
        assert!(
            stale.waiting().is_some(),
            "the controller has not seen the spec"
        );
    }
}
