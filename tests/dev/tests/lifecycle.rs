//! Starting and stopping: the CLI's up/status/down (vcp from its chart by default, or a local
//! `vcp serve`), refusals that touch nothing, and the guarantee that no process outlives its
//! cluster, vcp's pods included.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use vcp_dev::process::{group_members, pid_alive};
use vcp_dev::testing::DownOnDrop;
use vcp_dev::{DevCluster, Options, Supervision, cluster};

fn vcp_dev(args: &[&str], state_dir: &Path) -> Output {
    vcp_dev::testing::vcp_dev_cli(env!("CARGO_BIN_EXE_vcp-dev"), args, state_dir)
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

/// Runs `cmd` in bash after `source <state>/env`, as a user of `vcp-dev up` does.
fn with_env(state_dir: &Path, cmd: &str) -> Output {
    Command::new("bash")
        .arg("-c")
        .arg(format!("source {}/env && {cmd}", state_dir.display()))
        .output()
        .expect("bash runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The host pids of the containers of vcp's chart release (`devnode://<pid>` ids).
fn chart_container_pids(state_dir: &Path) -> Vec<u32> {
    let out = with_env(
        state_dir,
        &format!(
            "kubectl -n {} get pods -o jsonpath='{{.items[*].status.containerStatuses[*].containerID}}'",
            vcp_dev::chart::NAMESPACE
        ),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
        .split_whitespace()
        .filter_map(|id| id.strip_prefix("devnode://")?.parse().ok())
        .collect()
}

/// The main job as a user runs it: `up` installs vcp with its chart into the dev cluster,
/// provisions `demo` through the in-cluster API, and leaves an env file under which the `vcp`
/// client and the tenant's kubeconfig work; a second `up` changes nothing; `down` stops
/// everything, vcp's pods included.
#[test]
fn cli_up_installs_the_chart_and_down_leaves_no_process_or_listener() {
    let dir = tempfile::tempdir().unwrap();
    let _guard = DownOnDrop(dir.path());
    let out = vcp_dev(&["up", "--workers", "1"], dir.path());
    assert!(
        out.status.success(),
        "up failed: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("apiserver ready") && stdout.contains("nodes Ready"),
        "{stdout}"
    );
    print!("{stdout}");

    let status = vcp_dev(&["status"], dir.path());
    let status_text = text(&status.stdout);
    assert!(status.status.success(), "{status_text}");
    assert!(
        status_text.contains("vcp: chart mode (helm release vcp in namespace vcp-system)")
            && status_text.contains(" healthy, tenant demo"),
        "{status_text}"
    );
    let state_before = std::fs::read_to_string(dir.path().join("state.json")).unwrap();
    let pids = recorded_pids(dir.path());
    assert_eq!(
        pids.len(),
        10,
        "etcd, apiserver, kcm, scheduler, kwok, metrics-server, devnode, s3s-fs, provisioner, \
         postgres: no local vcp serve"
    );
    let record = vcp_dev::platform::read_record(dir.path())
        .unwrap()
        .expect("up records the platform");
    assert_eq!(record.mode, vcp_dev::platform::Mode::Chart);
    let node_port = record.node_port.expect("the API's NodePort");
    assert_eq!(record.api_url, format!("http://127.0.0.1:{node_port}"));
    assert!(
        stdout.contains(&format!("vcp API            {}", record.api_url)),
        "the API address is printed: {stdout}"
    );
    // vcp runs in pods: Postgres and two replicas, as processes of the devnode.
    let containers = chart_container_pids(dir.path());
    assert_eq!(containers.len(), 3, "{containers:?}");
    assert!(containers.iter().all(|p| pid_alive(*p)));
    let ports: Vec<u16> = cluster::read_state(dir.path())
        .unwrap()
        .components
        .iter()
        .filter_map(|c| c.port)
        .chain([node_port])
        .collect();

    // The main job: vcp provisioned tenant `demo`, the client reaches the API with what the
    // env file exports, and the tenant's admin kubeconfig works.
    assert!(stdout.contains("tenant demo Ready"), "{stdout}");
    let env = std::fs::read_to_string(dir.path().join("env")).unwrap();
    assert!(
        env.contains(&format!("VCP_API_URL='{}'", record.api_url)) && env.contains("VCP_TOKEN="),
        "{env}"
    );
    let list = with_env(dir.path(), "vcp tenant list");
    assert!(
        list.status.success() && text(&list.stdout).contains("demo"),
        "vcp tenant list: {}{}",
        text(&list.stdout),
        text(&list.stderr)
    );
    let wrong = with_env(dir.path(), "VCP_TOKEN=vcp_wrong vcp tenant list");
    assert!(
        !wrong.status.success(),
        "the API admits only the chart's admin token"
    );
    let ns = with_env(
        dir.path(),
        &format!(
            "kubectl --kubeconfig {}/demo.kubeconfig get namespaces -o name",
            dir.path().display()
        ),
    );
    assert!(
        text(&ns.stdout).contains("namespace/kube-system"),
        "{}",
        text(&ns.stderr)
    );
    assert!(ports.iter().all(|p| listening(*p)));

    let again = vcp_dev(&["up"], dir.path());
    assert!(
        !again.status.success(),
        "a second up on a running dir must fail"
    );
    let err = text(&again.stderr);
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
    assert!(down.status.success(), "{}", text(&down.stderr));
    assert_all_gone(&pids, Duration::from_secs(2));
    assert_all_gone(&containers, Duration::from_secs(2));
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
    // The state dir keeps its mode: a local vcp over the chart's release is refused before
    // anything starts.
    let local = vcp_dev(&["up", "--local"], dir.path());
    assert!(!local.status.success());
    assert!(
        text(&local.stderr).contains("set up with vcp in chart mode, not local"),
        "{}",
        text(&local.stderr)
    );
    assert!(
        recorded_pids(dir.path()).is_empty(),
        "the refused up started something"
    );
}

/// `--local`: `vcp serve` as a process of the dev environment, recorded with the cluster's
/// components, reached by the client through the env file.
#[test]
fn cli_up_local_runs_vcp_serve_as_a_process() {
    let dir = tempfile::tempdir().unwrap();
    let _guard = DownOnDrop(dir.path());
    let out = vcp_dev(&["up", "--local", "--workers", "1"], dir.path());
    assert!(
        out.status.success(),
        "up failed: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let status = vcp_dev(&["status"], dir.path());
    let status_text = text(&status.stdout);
    assert!(status.status.success(), "{status_text}");
    assert!(status_text.contains("vcp: local mode"), "{status_text}");
    let state = cluster::read_state(dir.path()).unwrap();
    let serve = state
        .components
        .iter()
        .find(|c| c.name == "vcp-serve")
        .expect("vcp serve is a recorded component");
    let record = vcp_dev::platform::read_record(dir.path()).unwrap().unwrap();
    assert_eq!(record.mode, vcp_dev::platform::Mode::Local);
    assert_eq!(
        record.api_url,
        format!("http://127.0.0.1:{}", serve.port.unwrap())
    );
    let list = with_env(dir.path(), "vcp tenant list");
    assert!(
        list.status.success() && text(&list.stdout).contains("demo"),
        "vcp tenant list: {}{}",
        text(&list.stdout),
        text(&list.stderr)
    );
    let pids = recorded_pids(dir.path());
    let down = vcp_dev(&["down"], dir.path());
    assert!(down.status.success(), "{}", text(&down.stderr));
    assert_all_gone(&pids, Duration::from_secs(2));
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
        real_node: false,
    })
    .await?;
    let pids = recorded_pids(dir.path());
    assert_eq!(
        pids.len(),
        9,
        "etcd, apiserver, kcm, scheduler, kwok, metrics-server, devnode, s3s-fs, postgres: the attached provisioner is a thread, not a process"
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
        // --local: the owner's own children, what the parent-death signal must take along.
        .args([
            "up",
            "--foreground",
            "--local",
            "--workers",
            "1",
            "--state-dir",
        ])
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
    let bridge = vcp_dev::devnet::bridge(net);
    let ours = link_index(&bridge).expect("the devnode's bridge is up");
    owner.kill().unwrap(); // SIGKILL: no destructor runs, only the parent-death signal
    owner.wait().unwrap();
    assert_all_gone(&pids, Duration::from_secs(5));
    // The devnode removes its network as it stops; on a loaded machine that can trail its
    // containers by a moment. Another dev cluster's devnode may claim the freed name at once
    // (tests run side by side), so the link compared is ours by its interface index.
    let still_ours = || link_index(&bridge) == Some(ours);
    let start = std::time::Instant::now();
    while still_ours() && start.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        !still_ours(),
        "the devnode of a killed owner left its network behind"
    );
}

/// The interface index of link `name`, if it exists: it tells one link from a later one of
/// the same name.
fn link_index(name: &str) -> Option<u32> {
    std::fs::read_to_string(
        std::path::Path::new("/sys/class/net")
            .join(name)
            .join("ifindex"),
    )
    .ok()?
    .trim()
    .parse()
    .ok()
}
