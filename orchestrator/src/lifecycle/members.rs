//! Growing a tenant's own etcd from one member to three while it serves (a plan change to a
//! plan with more members), as a pure machine: one member at a time, each added as a learner
//! and promoted once it has caught up, so the cluster never counts a member that is not there
//! yet and never loses its quorum.
//!
//! Data flow: the etcd step of a pass ([`crate::members`]) reads the StatefulSet `etcd`
//! ([`Members`]: the voting members recorded on it, and its pods) and the two Jobs of the next
//! member ([`JobSeen`]), asks [`next`] what to do, runs that, and renders the StatefulSet in
//! the [`Shape`] it gives while members are being added. The state lives in the host's
//! apiserver (the StatefulSet's annotation, the Jobs), so any replica resumes a growth where
//! another left it.
//!
//! For member `i` (the members before it vote):
//! 1. Job `add`: the member is added as a learner (it does not count towards the quorum);
//! 2. its pod starts: the StatefulSet at `i + 1` pods, its partition at `i` so the members
//!    that serve keep their pods, and the new pod told to join the cluster as it stands;
//! 3. Job `promote`: the learner is made a voting member once etcd says it is in sync;
//! 4. recorded: the StatefulSet's annotation counts it.
//!
//! With every member voting, the apiserver is rolled first to dial all of them (it dialled the
//! first member only, so a roll of that member would leave it with no etcd for a moment), then
//! the StatefulSet is rendered as the plan says (every member told the whole cluster), which
//! rolls the three members one at a time behind their readiness.

use serde::Serialize;

/// The StatefulSet annotation that counts the members voting in the tenant's etcd.
pub const ANNOTATION_MEMBERS: &str = "vcp.dev/etcd-members";

/// What the StatefulSet `etcd` says of the tenant's members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Members {
    /// Members voting ([`ANNOTATION_MEMBERS`]; a StatefulSet rendered before it: its pods).
    pub voting: u8,
    /// Pods asked for: one more than `voting` while a learner starts.
    pub replicas: u8,
    /// Pods below this ordinal are not rolled: above zero while members are added, and until
    /// the plan's StatefulSet is rendered.
    pub partition: u8,
}

/// How one of a member's Jobs is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobSeen {
    Absent,
    Running,
    Succeeded,
    Failed(String),
}

/// What a pass does next for a tenant's etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Growth {
    /// As many voting members as the plan: render the plan.
    Done,
    /// Run the Job that adds member `i` as a learner.
    Add(u8),
    /// Start member `i`'s pod.
    Start(u8),
    /// Run the Job that promotes member `i`.
    Promote(u8),
    /// Member `i` votes: count it on the StatefulSet.
    Promoted(u8),
    /// Every member votes, in the pods they were started in: the apiserver rolls to dial all
    /// of them before the plan's StatefulSet rolls the members.
    Settle,
    /// Wait for a Job; what it does.
    Wait(String),
    /// A Job failed: removed, so the next pass runs it again.
    Retry { job: String, why: String },
    /// The plan has fewer members than the cluster: refused at the plan change, never
    /// rendered (one member told it is alone would start a cluster of its own).
    Shrink { plan: u8, voting: u8 },
}

/// The Job that adds member `i` of the StatefulSet `uid` (a new StatefulSet, after a move
/// back to an etcd of the tenant's own, has new Jobs).
pub fn add_job(uid: &str, i: u8) -> String {
    format!("etcd-member-add-{i}-{}", short(uid))
}

/// The Job that promotes member `i` of the StatefulSet `uid`.
pub fn promote_job(uid: &str, i: u8) -> String {
    format!("etcd-member-promote-{i}-{}", short(uid))
}

fn short(uid: &str) -> &str {
    uid.get(..8).unwrap_or(uid)
}

/// The next step towards `target` voting members. `add` and `promote`: the Jobs of member
/// `seen.voting`, the next one.
pub fn next(target: u8, seen: Members, add: &JobSeen, promote: &JobSeen) -> Growth {
    if seen.voting > target {
        return Growth::Shrink {
            plan: target,
            voting: seen.voting,
        };
    }
    if seen.voting == target {
        return if seen.partition > 0 {
            Growth::Settle
        } else {
            Growth::Done
        };
    }
    let i = seen.voting;
    let what = |verb: &str| format!("{verb} etcd member {} of {target}", i + 1);
    if seen.replicas <= i {
        match add {
            JobSeen::Absent => Growth::Add(i),
            JobSeen::Running => Growth::Wait(what("adding")),
            JobSeen::Succeeded => Growth::Start(i),
            JobSeen::Failed(why) => Growth::Retry {
                job: what("adding"),
                why: why.clone(),
            },
        }
    } else {
        match promote {
            JobSeen::Absent => Growth::Promote(i),
            JobSeen::Running => Growth::Wait(format!("{}: catching up", what("promoting"))),
            JobSeen::Succeeded => Growth::Promoted(i),
            JobSeen::Failed(why) => Growth::Retry {
                job: what("promoting"),
                why: why.clone(),
            },
        }
    }
}

/// The StatefulSet while members are added (the template's `etcd_growth`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Shape {
    /// Pods.
    pub replicas: u8,
    /// Pods below this ordinal keep the pod they run.
    pub partition: u8,
    /// [`ANNOTATION_MEMBERS`].
    pub voting: u8,
    /// The members a new pod joins (`name=peer URL`, etcd's `--initial-cluster`): every member
    /// up to and including it, as the cluster lists them once it is added.
    pub members: Vec<u8>,
}

/// The shape a step renders; `None` for steps that leave the StatefulSet as it is.
pub fn shape(step: &Growth) -> Option<Shape> {
    match *step {
        Growth::Start(i) => Some(Shape {
            replicas: i + 1,
            partition: i,
            voting: i,
            members: (0..=i).collect(),
        }),
        Growth::Promoted(i) => Some(Shape {
            replicas: i + 1,
            partition: i + 1,
            voting: i + 1,
            members: (0..=i).collect(),
        }),
        _ => None,
    }
}

/// What a StatefulSet rendered at `replicas` pods, `partition`, with annotation `annotation`
/// says.
pub fn members(replicas: u8, partition: u8, annotation: Option<&str>) -> Members {
    let voting = annotation.and_then(|a| a.parse().ok()).unwrap_or(replicas);
    Members {
        voting,
        replicas,
        partition,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use JobSeen::*;

    /// Runs the machine against a simulated cluster from one member to `target`: every Job
    /// succeeds at its second look. The StatefulSet as each step leaves it.
    fn grow(target: u8) -> Vec<Growth> {
        let mut seen = members(1, 0, None);
        let (mut add, mut promote) = (Absent, Absent);
        let mut steps = Vec::new();
        for _ in 0..50 {
            let step = next(target, seen, &add, &promote);
            steps.push(step.clone());
            match &step {
                Growth::Done => return steps,
                // The apiserver rolled; then the plan's StatefulSet.
                Growth::Settle => seen.partition = 0,
                Growth::Add(_) => add = Running,
                Growth::Promote(_) => promote = Running,
                Growth::Wait(_) if add == Running => add = Succeeded,
                Growth::Wait(_) => promote = Succeeded,
                Growth::Start(_) | Growth::Promoted(_) => {
                    let s = shape(&step).unwrap();
                    // A member whose pod starts before it was added would start a cluster
                    // of its own: the learner is always in the cluster first.
                    assert_eq!(add, Succeeded, "{step:?} before its add");
                    // The pods that serve are never rolled while members are added.
                    assert!(s.partition + 1 >= s.replicas);
                    assert!(s.members.len() == usize::from(s.replicas));
                    seen = members(s.replicas, s.partition, Some(&s.voting.to_string()));
                    if matches!(step, Growth::Promoted(_)) {
                        assert_eq!(promote, Succeeded);
                        (add, promote) = (Absent, Absent);
                    }
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        panic!("no end: {steps:?}");
    }

    #[test]
    fn one_member_grows_to_three_one_learner_at_a_time() {
        let steps = grow(3);
        let kinds: Vec<String> = steps
            .iter()
            .map(|s| format!("{s:?}").split('(').next().unwrap().to_owned())
            .collect();
        assert_eq!(
            kinds,
            [
                "Add", "Wait", "Start", "Promote", "Wait", "Promoted", "Add", "Wait", "Start",
                "Promote", "Wait", "Promoted", "Settle", "Done"
            ]
        );
        assert_eq!(steps[2], Growth::Start(1));
        assert_eq!(steps[8], Growth::Start(2));
        assert_eq!(
            shape(&steps[8]),
            Some(Shape {
                replicas: 3,
                partition: 2,
                voting: 2,
                members: vec![0, 1, 2]
            })
        );
        assert_eq!(grow(1), [Growth::Done]);
    }

    #[test]
    fn failures_retry_and_a_smaller_plan_is_never_rendered() {
        let two = Members {
            voting: 1,
            replicas: 1,
            partition: 0,
        };
        match next(
            3,
            two,
            &Failed("etcdserver: too many learner members".into()),
            &Absent,
        ) {
            Growth::Retry { job, why } => {
                assert_eq!(job, "adding etcd member 2 of 3");
                assert!(why.contains("too many learner"));
            }
            other => panic!("{other:?}"),
        }
        let started = Members {
            voting: 1,
            replicas: 2,
            partition: 1,
        };
        assert!(matches!(
            next(3, started, &Succeeded, &Failed("not in sync".into())),
            Growth::Retry { .. }
        ));
        assert_eq!(
            next(1, members(3, 0, None), &Absent, &Absent),
            Growth::Shrink { plan: 1, voting: 3 }
        );
        assert_eq!(shape(&Growth::Shrink { plan: 1, voting: 3 }), None);
    }

    #[test]
    fn the_annotation_counts_and_an_old_statefulset_counts_its_pods() {
        assert_eq!(members(3, 0, None).voting, 3);
        assert_eq!(members(2, 1, Some("1")).voting, 1);
        assert_eq!(members(1, 0, Some("garbage")).voting, 1);
        // Grown, not settled: the partition says the plan's StatefulSet is not rendered yet.
        assert_eq!(
            next(3, members(3, 3, Some("3")), &Absent, &Absent),
            Growth::Settle
        );
        assert_eq!(
            next(3, members(3, 0, Some("3")), &Absent, &Absent),
            Growth::Done
        );
        let uid = "0123456789abcdef";
        assert_eq!(add_job(uid, 1), "etcd-member-add-1-01234567");
        assert_eq!(promote_job("ab", 2), "etcd-member-promote-2-ab");
    }
}
