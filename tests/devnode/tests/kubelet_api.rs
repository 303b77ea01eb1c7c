//! The devnode's kubelet API, called by the real host apiserver: `kubectl logs` of pods the
//! devnode runs as processes show their real output.

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
