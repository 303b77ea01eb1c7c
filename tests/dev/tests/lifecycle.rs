//! Starting and stopping: the CLI's up/status/down, refusals that touch nothing, and the
//! guarantee that no process outlives its cluster.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use vcp_dev::process::{group_members, pid_alive};
use vcp_dev::{DevCluster, Options, Supervision, cluster};

fn vcp_dev(args: &[&str], state_dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vcp-dev"))
        .args(args)
        .arg("--state-dir")
        .arg(state_dir)
        .output()
        .expect("vcp-dev runs")
}

/// Runs `vcp-dev down` when dropped, so a failing assertion never leaks a detached cluster.
struct DownOnDrop<'a>(&'a Path);

impl Drop for DownOnDrop<'_> {
    fn drop(&mut self) {
        let _ = cluster::down(self.0);
    }
}

fn recorded_pids(state_dir: &Path) -> Vec<u32> {
    cluster::read_state(state_dir)
        .map(|s| s.components.iter().map(|c| c.pid).collect())
        .unwrap_or_default()
}

fn assert_all_gone(pids: &[u32], within: Duration) {
    let start = Instant::now();
    loop {
        let alive: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|p| pid_alive(*p) || !group_members(*p).is_empty())
            .collect();
        if alive.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < within,
            "still running after {within:?}: {alive:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn listening(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

#[test]
fn cli_up_refuses_a_running_dir_and_down_leaves_no_process_or_listener() {
    let dir = tempfile::tempdir().unwrap();
    let _guard = DownOnDrop(dir.path());
    let out = vcp_dev(&["up", "--workers", "1"], dir.path());
    assert!(
        out.status.success(),
        "up failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("apiserver ready") && stdout.contains("nodes Ready"),
        "{stdout}"
    );
    print!("{stdout}");

    let status = vcp_dev(&["status"], dir.path());
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stdout)
    );
    let state_before = std::fs::read_to_string(dir.path().join("state.json")).unwrap();
    let pids = recorded_pids(dir.path());
    let ports: Vec<u16> = cluster::read_state(dir.path())
        .unwrap()
        .components
        .iter()
        .filter_map(|c| c.port)
        .collect();
    assert_eq!(
        pids.len(),
        10,
        "etcd, apiserver, kcm, scheduler, kwok, metrics-server, devnode, provisioner, postgres, vcp-serve"
    );
    // The main job: vcp provisioned tenant `demo` and its admin kubeconfig works.
    assert!(stdout.contains("tenant demo Ready"), "{stdout}");
    let env = std::fs::read_to_string(dir.path().join("env")).unwrap();
    assert!(
        env.contains("VCP_API_URL=") && env.contains("VCP_TOKEN="),
        "{env}"
    );
    let ns = std::process::Command::new(dir.path().join("bin/kubectl"))
        .arg("--kubeconfig")
        .arg(dir.path().join("demo.kubeconfig"))
        .args(["get", "namespaces", "-o", "name"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&ns.stdout).contains("namespace/kube-system"),
        "{}",
        String::from_utf8_lossy(&ns.stderr)
    );
    assert!(ports.iter().all(|p| listening(*p)));

    let again = vcp_dev(&["up"], dir.path());
    assert!(
        !again.status.success(),
        "a second up on a running dir must fail"
    );
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        err.contains("already running") && err.contains("vcp-dev down"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("state.json")).unwrap(),
        state_before
    );
    assert!(
        pids.iter().all(|p| pid_alive(*p)),
        "the refused up touched a process"
    );

    let net = vcp_dev::devnet::recorded(&dir.path().join("devnode"))
        .expect("the devnode records its network");
    let bridge = std::path::Path::new("/sys/class/net").join(vcp_dev::devnet::bridge(net));
    assert!(
        bridge.exists(),
        "the devnode's bridge is up while the cluster runs"
    );

    let down = vcp_dev(&["down"], dir.path());
    assert!(
        down.status.success(),
        "{}",
        String::from_utf8_lossy(&down.stderr)
    );
    assert_all_gone(&pids, Duration::from_secs(2));
    assert!(
        ports.iter().all(|p| !listening(*p)),
        "a port still listens after down"
    );
    let twice = vcp_dev(&["down"], dir.path());
    assert!(twice.status.success(), "down must be safe to run twice");
    let status = vcp_dev(&["status"], dir.path());
    assert!(
        !status.status.success(),
        "status of a stopped cluster is not healthy"
    );
}

#[test]
fn a_missing_binary_names_the_build_command_and_starts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let _guard = DownOnDrop(dir.path());
    let empty = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vcp-dev"))
        .args(["up", "--state-dir"])
        .arg(dir.path())
        .env("VCP_BIN_DIR", empty.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tests/kube-bin/build.sh") && err.contains("is not built"),
        "{err}"
    );
    assert!(recorded_pids(dir.path()).is_empty());
}

#[tokio::test]
async fn dropping_a_cluster_stops_every_process_it_started() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = DevCluster::start_with(Options {
        state_dir: dir.path().to_owned(),
        workers: 1,
        supervision: Supervision::Attached,
    })
    .await?;
    let pids = recorded_pids(dir.path());
    assert_eq!(
        pids.len(),
        8,
        "etcd, apiserver, kcm, scheduler, kwok, metrics-server, devnode, postgres: the attached provisioner is a thread, not a process"
    );
    assert!(pids.iter().all(|p| pid_alive(*p)));
    drop(cluster);
    assert_all_gone(&pids, Duration::from_secs(1));
    Ok(())
}

#[test]
fn a_killed_owner_takes_its_cluster_along() {
    let dir = tempfile::tempdir().unwrap();
    let _guard = DownOnDrop(dir.path());
    let mut owner = Command::new(env!("CARGO_BIN_EXE_vcp-dev"))
        .args(["up", "--foreground", "--workers", "1", "--state-dir"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let pids = loop {
        let pids = recorded_pids(dir.path());
        if !pids.is_empty() {
            break pids;
        }
        assert!(
            owner.try_wait().unwrap().is_none(),
            "vcp-dev up --foreground exited early"
        );
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "cluster did not start"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    // The owner is alive and so is its cluster: only the kill may stop it.
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        owner.try_wait().unwrap().is_none(),
        "vcp-dev up --foreground returned on its own"
    );
    assert!(
        pids.iter().all(|p| pid_alive(*p)),
        "the cluster stopped before its owner was killed"
    );
    let net = vcp_dev::devnet::recorded(&dir.path().join("devnode")).expect("devnode network");
    let bridge = std::path::Path::new("/sys/class/net").join(vcp_dev::devnet::bridge(net));
    owner.kill().unwrap(); // SIGKILL: no destructor runs, only the parent-death signal
    owner.wait().unwrap();
    assert_all_gone(&pids, Duration::from_secs(5));
    // The devnode removes its network as it stops; on a loaded machine that can trail its
    // containers by a moment.
    let start = std::time::Instant::now();
    while bridge.exists() && start.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        !bridge.exists(),
        "the devnode of a killed owner left its network behind"
    );
}
