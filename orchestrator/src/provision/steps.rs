//! The provisioning steps and what their results mean for a tenant (pure).
//!
//! Bring-up is a fixed sequence, each step gated on the one before being ready. A pass walks
//! the sequence from the start (every step is idempotent, so repeating a finished one costs a
//! few no-op applies), stops at the first step that is not ready yet, and turns what it saw
//! into conditions and a phase. That is what lets any replica resume any tenant from any point.

use std::time::Duration;
use time::OffsetDateTime;
use vcp_core::lifecycle::{Condition, ConditionReason, ConditionStatus, ConditionType, Phase};

/// Bring-up steps, in order. The name is the condition type.
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

/// Conditions and phase after a bring-up pass that got as far as `results` (in step order;
/// steps after the last result were not reached).
pub fn bring_up(
    results: &[(Step, StepResult)],
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
    conditions.push(condition(
        ConditionType::Ready,
        S::of(ready),
        if ready { R::Ready } else { R::Provisioning },
        "",
        prev,
        now,
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
