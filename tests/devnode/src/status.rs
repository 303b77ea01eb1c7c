//! Pod status from container states (pure), shaped as a kubelet reports it.

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, HostIP, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// How a container ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Termination {
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub reason: String,
    /// What the container wrote to its termination-message file (or, per its policy, the
    /// tail of its log after a failure).
    pub message: Option<String>,
    pub started_at: Time,
    pub finished_at: Time,
}

/// A container as the pod worker sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerView {
    pub name: String,
    pub image: String,
    pub init: bool,
    pub restart_count: i32,
    pub pid: Option<u32>,
    pub running_since: Option<Time>,
    pub started: bool,
    pub ready: bool,
    /// Waiting reason and message (ErrImagePull, CrashLoopBackOff, ContainerCreating ...).
    pub waiting: Option<(String, String)>,
    /// The current termination, when exited and not (yet) restarted.
    pub terminated: Option<Termination>,
    /// The previous termination, after a restart.
    pub last: Option<Termination>,
}

fn state_of(c: &ContainerView) -> ContainerState {
    if let Some(since) = &c.running_since {
        return ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(since.clone()),
            }),
            ..Default::default()
        };
    }
    if let Some(t) = &c.terminated {
        return terminated(t);
    }
    let (reason, message) = c
        .waiting
        .clone()
        .unwrap_or_else(|| ("ContainerCreating".into(), String::new()));
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason),
            message: (!message.is_empty()).then_some(message),
        }),
        ..Default::default()
    }
}

fn terminated(t: &Termination) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: t.exit_code,
            signal: t.signal,
            reason: Some(t.reason.clone()),
            message: t.message.clone(),
            started_at: Some(t.started_at.clone()),
            finished_at: Some(t.finished_at.clone()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn container_status(c: &ContainerView) -> ContainerStatus {
    ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone(),
        image_id: String::new(),
        container_id: c.pid.map(|p| format!("devnode://{p}")),
        ready: c.ready,
        started: Some(c.started),
        restart_count: c.restart_count,
        state: Some(state_of(c)),
        last_state: Some(c.last.as_ref().map(terminated).unwrap_or_default()),
        ..Default::default()
    }
}

/// What the pod as a whole is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
}

impl Phase {
    fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
        }
    }
}

/// The pod phase from its containers and restart policy (kubelet rules, simplified).
pub fn phase(containers: &[ContainerView], restart_policy: &str) -> Phase {
    let (init, main): (Vec<_>, Vec<_>) = containers.iter().partition(|c| c.init);
    let init_failed = init.iter().any(|c| {
        c.terminated.as_ref().is_some_and(|t| t.exit_code != 0) && restart_policy == "Never"
    });
    if init_failed {
        return Phase::Failed;
    }
    let init_done = init
        .iter()
        .all(|c| c.terminated.as_ref().is_some_and(|t| t.exit_code == 0));
    if !init_done
        || main
            .iter()
            .all(|c| c.running_since.is_none() && c.terminated.is_none())
    {
        return Phase::Pending;
    }
    if main.iter().any(|c| c.running_since.is_some()) {
        return Phase::Running;
    }
    // Everything exited and will not be restarted (or restarts are pending).
    let all_exited = main.iter().all(|c| c.terminated.is_some());
    let restarts = match restart_policy {
        "Never" => false,
        "OnFailure" => main
            .iter()
            .any(|c| c.terminated.as_ref().is_some_and(|t| t.exit_code != 0)),
        _ => true,
    };
    if all_exited && !restarts {
        if main
            .iter()
            .all(|c| c.terminated.as_ref().is_some_and(|t| t.exit_code == 0))
        {
            Phase::Succeeded
        } else {
            Phase::Failed
        }
    } else {
        Phase::Running
    }
}

/// The full status subresource.
pub fn pod_status(
    containers: &[ContainerView],
    restart_policy: &str,
    pod_ip: Option<&str>,
    host_ip: &str,
    start_time: &Time,
    now: &Time,
    previous: Option<&PodStatus>,
) -> PodStatus {
    let phase = phase(containers, restart_policy);
    let (init, main): (Vec<_>, Vec<_>) = containers.iter().partition(|c| c.init);
    let initialized = init
        .iter()
        .all(|c| c.terminated.as_ref().is_some_and(|t| t.exit_code == 0));
    let containers_ready = !main.is_empty() && main.iter().all(|c| c.ready);
    let sandbox = pod_ip.is_some();
    let condition = |type_: &str, ok: bool| {
        let status = if ok { "True" } else { "False" }.to_owned();
        // Keep the transition time while the status is unchanged, as a kubelet does.
        let since = previous
            .and_then(|p| p.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
            .filter(|c| c.status == status)
            .and_then(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| now.clone());
        PodCondition {
            type_: type_.to_owned(),
            status,
            last_transition_time: Some(since),
            ..Default::default()
        }
    };
    PodStatus {
        phase: Some(phase.as_str().to_owned()),
        conditions: Some(vec![
            condition("PodReadyToStartContainers", sandbox),
            condition("Initialized", initialized),
            condition("Ready", containers_ready),
            condition("ContainersReady", containers_ready),
            condition("PodScheduled", true),
        ]),
        host_ip: Some(host_ip.to_owned()),
        host_ips: Some(vec![HostIP {
            ip: host_ip.to_owned(),
        }]),
        pod_ip: pod_ip.map(str::to_owned),
        pod_ips: pod_ip.map(|ip| vec![PodIP { ip: ip.to_owned() }]),
        start_time: Some(start_time.clone()),
        init_container_statuses: (!init.is_empty())
            .then(|| init.iter().map(|c| container_status(c)).collect()),
        container_statuses: Some(main.iter().map(|c| container_status(c)).collect()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + secs).unwrap())
    }

    fn view(name: &str) -> ContainerView {
        ContainerView {
            name: name.into(),
            image: "img".into(),
            init: false,
            restart_count: 0,
            pid: None,
            running_since: None,
            started: false,
            ready: false,
            waiting: None,
            terminated: None,
            last: None,
        }
    }

    fn exited(code: i32) -> Option<Termination> {
        Some(Termination {
            exit_code: code,
            signal: None,
            reason: if code == 0 { "Completed" } else { "Error" }.into(),
            message: None,
            started_at: t(0),
            finished_at: t(1),
        })
    }

    #[test]
    fn a_pod_runs_once_init_is_done_and_a_container_is_up() {
        let mut init = view("init");
        init.init = true;
        let mut main = view("main");
        assert_eq!(
            phase(&[init.clone(), main.clone()], "Always"),
            Phase::Pending
        );
        init.terminated = exited(0);
        main.running_since = Some(t(2));
        assert_eq!(phase(&[init, main], "Always"), Phase::Running);
    }

    #[test]
    fn exits_map_to_succeeded_or_failed_by_restart_policy() {
        let mut a = view("a");
        a.terminated = exited(0);
        assert_eq!(phase(std::slice::from_ref(&a), "Never"), Phase::Succeeded);
        assert_eq!(
            phase(std::slice::from_ref(&a), "OnFailure"),
            Phase::Succeeded
        );
        assert_eq!(phase(std::slice::from_ref(&a), "Always"), Phase::Running);
        a.terminated = exited(3);
        assert_eq!(phase(std::slice::from_ref(&a), "Never"), Phase::Failed);
        assert_eq!(phase(std::slice::from_ref(&a), "OnFailure"), Phase::Running);
        let mut init = view("i");
        init.init = true;
        init.terminated = exited(1);
        assert_eq!(phase(&[init, view("m")], "Never"), Phase::Failed);
    }

    #[test]
    fn status_reports_ready_conditions_ips_and_waiting_reasons() {
        let mut a = view("a");
        a.waiting = Some(("ErrImagePull".into(), "image \"x\" is not known".into()));
        let s = pod_status(
            &[a.clone()],
            "Always",
            None,
            "127.0.0.1",
            &t(0),
            &t(5),
            None,
        );
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        let cs = &s.container_statuses.as_ref().unwrap()[0];
        assert_eq!(
            cs.state
                .as_ref()
                .unwrap()
                .waiting
                .as_ref()
                .unwrap()
                .reason
                .as_deref(),
            Some("ErrImagePull")
        );

        a.waiting = None;
        a.running_since = Some(t(3));
        a.ready = true;
        a.restart_count = 2;
        a.last = exited(137);
        let s2 = pod_status(
            &[a],
            "Always",
            Some("10.245.0.2"),
            "127.0.0.1",
            &t(0),
            &t(9),
            Some(&s),
        );
        assert_eq!(s2.pod_ip.as_deref(), Some("10.245.0.2"));
        let ready = s2
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.status, "True");
        let cs = &s2.container_statuses.as_ref().unwrap()[0];
        assert_eq!(cs.restart_count, 2);
        assert_eq!(
            cs.last_state
                .as_ref()
                .unwrap()
                .terminated
                .as_ref()
                .unwrap()
                .exit_code,
            137
        );
        let sched = |s: &PodStatus| {
            s.conditions
                .as_ref()
                .unwrap()
                .iter()
                .find(|c| c.type_ == "PodScheduled")
                .unwrap()
                .last_transition_time
                .clone()
        };
        assert_eq!(
            sched(&s2),
            sched(&s),
            "an unchanged condition keeps its transition time"
        );
    }
}
