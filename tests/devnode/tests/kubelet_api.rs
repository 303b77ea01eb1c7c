//! The devnode's kubelet API, called by the real host apiserver: `kubectl logs` of pods the
//! devnode runs as processes show their real output; `kubectl exec` runs in a container's
//! environment with its exit code; `kubectl port-forward` reaches a pod's port.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;
use vcp_dev::DevCluster;
use vcp_dev::testing::{eventually, namespace};

type Res<T = ()> = anyhow::Result<T>;

/// A pod on the devnode; `containers` is the YAML flow list of its containers.
fn devnode_pod(ns: &str, name: &str, containers: serde_json::Value) -> Res<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "nodeSelector": {"vcp.dev/runtime": "process"},
            "tolerations": [{"key": "vcp.dev/runtime", "operator": "Exists"}],
            "containers": containers,
        },
    }))?)
}

fn kubectl(cluster: &DevCluster, args: &[&str]) -> Command {
    let mut cmd = Command::new(cluster.kubectl());
    cmd.arg(format!(
        "--kubeconfig={}",
        cluster.kubeconfig_path().display()
    ))
    .args(args);
    cmd
}

/// Runs kubectl; its stdout, or an error with its stderr.
fn kubectl_out(cluster: &DevCluster, args: &[&str]) -> Res<String> {
    let out = kubectl(cluster, args).output()?;
    anyhow::ensure!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

fn restarts(p: &Pod, container: &str) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == container))
        .map_or(0, |c| c.restart_count)
}

#[tokio::test]
async fn kubectl_logs_through_the_host_apiserver_show_a_devnode_containers_real_output() -> Res {
    let cluster = DevCluster::shared().await?;
    let client = cluster.connect().await?;
    let ns = "devnode-logs";
    namespace(&client, ns).await?;
    let pods: Api<Pod> = Api::namespaced(client, ns);
    let pod = devnode_pod(
        ns,
        "printer",
        serde_json::json!([
            {"name": "lines", "image": "vcp.dev/host:any",
             "command": ["sh", "-c", "for i in 1 2 3 4 5; do echo line-$i; done; echo oops >&2; sleep 3600"]},
            {"name": "ticker", "image": "vcp.dev/host:any",
             "command": ["sh", "-c", "i=0; while true; do i=$((i+1)); echo tick-$i; sleep 0.2; done"]},
            {"name": "restarts", "image": "vcp.dev/host:any",
             "command": ["sh", "-c", "echo run-$$; sleep 0.5; exit 1"]},
        ]),
    )?;
    let _ = pods.delete("printer", &Default::default()).await;
    eventually("old printer gone", Duration::from_secs(30), || async {
        Ok(pods.get_opt("printer").await?.is_none().then_some(()))
    })
    .await?;
    pods.create(&PostParams::default(), &pod).await?;

    let all = eventually(
        "all five lines in kubectl logs",
        Duration::from_secs(30),
        || async {
            Ok(
                kubectl_out(cluster, &["logs", "-n", ns, "printer", "-c", "lines"])
                    .ok()
                    .filter(|s| s.contains("line-5") && s.contains("oops")),
            )
        },
    )
    .await?;
    assert_eq!(all, "line-1\nline-2\nline-3\nline-4\nline-5\noops\n");
    let tail = kubectl_out(
        cluster,
        &["logs", "-n", ns, "printer", "-c", "lines", "--tail=2"],
    )?;
    assert_eq!(tail, "line-5\noops\n");
    let limited = kubectl_out(
        cluster,
        &[
            "logs",
            "-n",
            ns,
            "printer",
            "-c",
            "lines",
            "--limit-bytes=9",
        ],
    )?;
    assert_eq!(limited, "line-1\nli");

    // -f streams lines as the container writes them.
    let mut follow = kubectl(
        cluster,
        &["logs", "-n", ns, "printer", "-c", "ticker", "-f"],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()?;
    let stdout = follow.stdout.take().unwrap();
    let lines = tokio::task::spawn_blocking(move || {
        let mut read = Vec::new();
        for line in BufReader::new(stdout).lines().take(15) {
            read.push(line?);
        }
        std::io::Result::Ok(read)
    });
    let lines = tokio::time::timeout(Duration::from_secs(20), lines).await;
    let _ = follow.kill();
    let _ = follow.wait();
    let lines = lines???;
    assert!(lines.iter().all(|l| l.starts_with("tick-")), "{lines:?}");
    let n: Vec<u32> = lines.iter().map(|l| l[5..].parse().unwrap()).collect();
    assert!(n.windows(2).all(|w| w[1] == w[0] + 1), "{n:?}");

    // --previous is the run before the current one.
    eventually("a restart", Duration::from_secs(60), || async {
        Ok((restarts(&pods.get("printer").await?, "restarts") >= 1).then_some(()))
    })
    .await?;
    let previous = kubectl_out(
        cluster,
        &["logs", "-n", ns, "printer", "-c", "restarts", "--previous"],
    )?;
    assert!(
        previous.starts_with("run-") && previous.lines().count() == 1,
        "{previous:?}"
    );
    // A followed log ends when its container stops, as a kubelet's does.
    let started = std::time::Instant::now();
    let ending = kubectl(
        cluster,
        &["logs", "-n", ns, "printer", "-c", "restarts", "-f"],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()?;
    let ended = tokio::task::spawn_blocking(move || ending.wait_with_output());
    let ended = tokio::time::timeout(Duration::from_secs(20), ended).await;
    assert!(
        matches!(&ended, Ok(Ok(Ok(o))) if o.status.success()),
        "kubectl logs -f of a stopping container did not end: {ended:?}"
    );
    eprintln!(
        "logs -f of a stopping container ended after {:?}",
        started.elapsed()
    );
    let refused = kubectl(
        cluster,
        &["logs", "-n", ns, "printer", "-c", "lines", "--previous"],
    )
    .output()?;
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("previous terminated container"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    pods.delete("printer", &Default::default()).await?;
    Ok(())
}

/// Creates `name` afresh (a previous run's pod is deleted first) and waits until it runs.
async fn fresh_running_pod(pods: &Api<Pod>, pod: &Pod) -> Res {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let _ = pods.delete(&name, &Default::default()).await;
    eventually(
        &format!("old {name} gone"),
        Duration::from_secs(30),
        || async { Ok(pods.get_opt(&name).await?.is_none().then_some(())) },
    )
    .await?;
    pods.create(&PostParams::default(), pod).await?;
    eventually(
        &format!("{name} Ready"),
        Duration::from_secs(60),
        || async {
            let p = pods.get(&name).await?;
            let ready = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            Ok(ready.then_some(()))
        },
    )
    .await
}

#[tokio::test]
async fn kubectl_exec_and_cp_run_in_the_containers_environment_with_exit_code_stdin_and_tty() -> Res
{
    let cluster = DevCluster::shared().await?;
    let client = cluster.connect().await?;
    let ns = "devnode-exec";
    namespace(&client, ns).await?;
    let pods: Api<Pod> = Api::namespaced(client, ns);
    let pod = devnode_pod(
        ns,
        "shell",
        serde_json::json!([{"name": "main", "image": "vcp.dev/host:any",
            "env": [{"name": "GREETING", "value": "hello from the pod"}],
            "command": ["sleep", "3600"]}]),
    )?;
    fresh_running_pod(&pods, &pod).await?;
    let ip = pods
        .get("shell")
        .await?
        .status
        .and_then(|s| s.pod_ip)
        .unwrap_or_default();

    let out = kubectl(
        cluster,
        &["exec", "-n", ns, "shell", "--", "sh", "-c",
          "echo \"$GREETING\"; ip -4 -o addr show scope global | awk '{print $4}' | cut -d/ -f1; echo oops >&2; exit 3"],
    )
    .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{stdout} / {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("hello from the pod"));
    // The pod's network namespace: its only global address is the pod IP.
    assert_eq!(lines.next(), Some(ip.as_str()), "{stdout}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("oops"));
    // Names missing from the hosts file fail at once: the pod's resolver asks its own loopback,
    // not the machine's nameserver, which no pod reaches.
    let resolv = kubectl_out(
        cluster,
        &["exec", "-n", ns, "shell", "--", "cat", "/etc/resolv.conf"],
    )?;
    assert!(resolv.contains("nameserver 127.0.0.1\n"), "{resolv}");

    let mut cat = kubectl(cluster, &["exec", "-i", "-n", ns, "shell", "--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    {
        use std::io::Write;
        let mut stdin = cat.stdin.take().unwrap();
        stdin.write_all(b"through stdin\n")?;
    }
    let out = cat.wait_with_output()?;
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout)?, "through stdin\n");

    // An interactive session with a TTY, kubectl itself on a terminal (script(1) gives it one).
    let kubeconfig = cluster.kubeconfig_path().display().to_string();
    let session = format!(
        "{} --kubeconfig={kubeconfig} exec -it -n {ns} shell -- sh",
        cluster.kubectl().display()
    );
    let mut script = Command::new("script")
        .args(["-qec", &session, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    {
        use std::io::Write;
        let mut typed = script.stdin.take().unwrap();
        // Typed once the shell is there; its input then waits in the terminal.
        tokio::time::sleep(Duration::from_secs(1)).await;
        typed.write_all(b"tty; stty size; exit 5\n")?;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::task::spawn_blocking(move || script.wait_with_output()),
    )
    .await???;
    let shown = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(5), "{shown}");
    assert!(shown.contains("/dev/pts/"), "{shown}");

    // kubectl cp both ways: tar in the container, through exec.
    let local = tempfile::tempdir()?;
    std::fs::write(local.path().join("up.txt"), "copied up\n")?;
    let remote = format!("/tmp/vcp-devnode-cp-{}", std::process::id());
    let up = local.path().join("up.txt").display().to_string();
    kubectl_out(cluster, &["cp", &up, &format!("{ns}/shell:{remote}")])?;
    let seen = kubectl_out(cluster, &["exec", "-n", ns, "shell", "--", "cat", &remote])?;
    assert_eq!(seen, "copied up\n");
    let down = local.path().join("down.txt").display().to_string();
    kubectl_out(cluster, &["cp", &format!("{ns}/shell:{remote}"), &down])?;
    assert_eq!(std::fs::read_to_string(&down)?, "copied up\n");
    kubectl_out(cluster, &["exec", "-n", ns, "shell", "--", "rm", &remote])?;
    pods.delete("shell", &Default::default()).await?;
    Ok(())
}

#[tokio::test]
async fn kubectl_port_forward_reaches_a_devnode_pods_port() -> Res {
    let cluster = DevCluster::shared().await?;
    let client = cluster.connect().await?;
    let ns = "devnode-forward";
    namespace(&client, ns).await?;
    let pods: Api<Pod> = Api::namespaced(client, ns);
    let pod = devnode_pod(
        ns,
        "web",
        serde_json::json!([{"name": "web", "image": "vcp.dev/host:any",
            "command": ["python3", "-m", "http.server", "--bind", "$(POD_IP)", "8080"],
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
            "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}}]),
    )?;
    fresh_running_pod(&pods, &pod).await?;
    let errors = cluster.state_dir().join("logs/kubectl-port-forward.log");
    let mut pf = kubectl(cluster, &["port-forward", "-n", ns, "pod/web", ":8080"])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&errors)?)
        .spawn()?;
    let stdout = pf.stdout.take().unwrap();
    let (port_tx, port_rx) = tokio::sync::oneshot::channel();
    // Reads kubectl's output to its end: a closed pipe would kill it at its next line.
    std::thread::spawn(move || {
        let mut port_tx = Some(port_tx);
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // "Forwarding from 127.0.0.1:41234 -> 8080"
            let port = line
                .split("127.0.0.1:")
                .nth(1)
                .and_then(|r| r.split(' ').next())
                .and_then(|p| p.parse::<u16>().ok());
            if let (Some(port), Some(tx)) = (port, port_tx.take()) {
                let _ = tx.send(Some(port));
            }
        }
    });
    let port = tokio::time::timeout(Duration::from_secs(20), port_rx).await;
    let result = async {
        let port = port??.ok_or_else(|| anyhow::anyhow!("no port from kubectl port-forward"))?;
        let get = move || -> std::io::Result<String> {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
            s.write_all(b"GET / HTTP/1.0\r\nHost: web\r\n\r\n")?;
            let mut body = Vec::new();
            s.read_to_end(&mut body)?;
            Ok(String::from_utf8_lossy(&body).into_owned())
        };
        let body = tokio::task::spawn_blocking(get).await??;
        anyhow::ensure!(body.starts_with("HTTP/1.0 200"), "{body}");
        anyhow::ensure!(body.contains("Directory listing"), "{body}");
        Ok(())
    }
    .await;
    let _ = pf.kill();
    let _ = pf.wait();
    result.map_err(|e| {
        let stderr = std::fs::read_to_string(&errors).unwrap_or_default();
        anyhow::anyhow!("{e}; kubectl port-forward said: {stderr}")
    })?;
    pods.delete("web", &Default::default()).await?;
    Ok(())
}

#[tokio::test]
async fn kubectl_top_shows_the_real_usage_of_a_devnode_pods_processes() -> Res {
    let cluster = DevCluster::shared().await?;
    let client = cluster.connect().await?;
    let ns = "devnode-top";
    namespace(&client, ns).await?;
    let pods: Api<Pod> = Api::namespaced(client, ns);
    // A shell that spins in a child process (the container's descendants count) beside one
    // that sleeps.
    let pod = devnode_pod(
        ns,
        "usage",
        serde_json::json!([
            {"name": "spin", "image": "vcp.dev/host:any",
             "command": ["sh", "-c", "sh -c 'while :; do :; done' & wait"]},
            {"name": "idle", "image": "vcp.dev/host:any", "command": ["sleep", "3600"]},
        ]),
    )?;
    fresh_running_pod(&pods, &pod).await?;
    // metrics-server scrapes every 10 s and needs two scrapes for a rate.
    let rows = eventually(
        "kubectl top of the devnode pod's containers",
        Duration::from_secs(90),
        || async {
            let out =
                kubectl(cluster, &["top", "pod", "usage", "-n", ns, "--containers"]).output()?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let rows: Vec<Vec<String>> = text
                .lines()
                .skip(1)
                .map(|l| l.split_whitespace().map(str::to_owned).collect())
                .collect();
            Ok((out.status.success() && rows.len() == 2).then_some(rows))
        },
    )
    .await?;
    let millicores = |c: &str| -> Res<i64> {
        let row = rows
            .iter()
            .find(|r| r[1] == c)
            .ok_or_else(|| anyhow::anyhow!("no {c} in {rows:?}"))?;
        Ok(row[2].trim_end_matches('m').parse()?)
    };
    // A spinning process gets a good share of a core even on a busy two-core machine.
    assert!(millicores("spin")? >= 100, "{rows:?}");
    assert!(millicores("idle")? <= 20, "{rows:?}");
    let memory = rows.iter().find(|r| r[1] == "spin").map(|r| r[3].clone());
    assert!(
        memory
            .as_deref()
            .is_some_and(|m| m.ends_with("Mi") && m != "0Mi"),
        "{rows:?}"
    );
    // The node as a whole: the devnode's own figure exists too.
    let nodes = kubectl_out(cluster, &["top", "node", vcp_dev::cluster::DEVNODE_NAME])?;
    assert!(nodes.contains(vcp_dev::cluster::DEVNODE_NAME), "{nodes}");
    let _ = pods.delete("usage", &Default::default()).await;
    Ok(())
}
