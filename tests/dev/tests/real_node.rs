//! The real node (`vcp_dev::node`): a kubelet, containerd and runc joined to the dev cluster,
//! running containers from the images `vcp_dev::images` writes. Nothing here is simulated: the
//! pod's probe, token, volumes, logs and exec all go through the real kubelet and runtime.

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, LogParams, PostParams};
use std::time::Duration;
use vcp_dev::testing::{eventually, kubectl_with, namespace};
use vcp_dev::{DevCluster, Options, Supervision, images, node};

fn pod(name: &str, image: &str, command: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {node::NODE_LABEL.0: node::NODE_LABEL.1},
            "tolerations": [{"key": node::NODE_LABEL.0, "operator": "Exists"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "web",
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", command],
                "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
                "volumeMounts": [
                    {"name": "www", "mountPath": "/www"},
                    {"name": "scratch", "mountPath": "/scratch"},
                ],
            }],
            "volumes": [
                {"name": "www", "configMap": {"name": "web"}},
                {"name": "scratch", "emptyDir": {}},
            ],
        },
    }))?)
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test]
async fn a_pod_runs_on_the_real_node_with_probe_token_volumes_logs_and_exec() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let mut cluster = DevCluster::start_with(Options {
        state_dir: dir.path().to_owned(),
        workers: 1,
        supervision: Supervision::Attached,
        real_node: true,
    })
    .await?;
    let client = cluster.client();
    let n = Api::<Node>::all(client.clone())
        .get(node::NODE_NAME)
        .await?;
    let info = n
        .status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .expect("node info");
    assert!(
        info.container_runtime_version.starts_with("containerd://"),
        "{}",
        info.container_runtime_version
    );

    namespace(&client, "real").await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "real");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web"},
            "data": {"index.html": "served by a real container\n"},
        }))?,
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "real");
    pods.create(
        &PostParams::default(),
        &pod(
            "web",
            images::BUSYBOX_IMAGE,
            "echo started on the real node; exec httpd -f -p 8080 -h /www",
        )?,
    )
    .await?;
    let p = eventually(
        "pod web Ready on the real node",
        Duration::from_secs(90),
        || async { Ok(pods.get("web").await.ok().filter(ready)) },
    )
    .await?;
    assert_eq!(
        p.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(node::NODE_NAME)
    );
    let ip = p
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("pod IP");
    assert!(
        ip.starts_with("10.246."),
        "a bridge address of the node: {ip}"
    );

    // The host reaches the pod at its address, through the node's link.
    let body = reqwest::get(format!("http://{ip}:8080/"))
        .await?
        .text()
        .await?;
    assert_eq!(body, "served by a real container\n");

    let logs = pods.logs("web", &LogParams::default()).await?;
    assert!(logs.contains("started on the real node"), "{logs}");

    let kc = cluster.kubeconfig_path().to_owned();
    let (ok, out, err) = kubectl_with(
        &cluster,
        &kc,
        &[
            "-n",
            "real",
            "exec",
            "web",
            "--",
            "sh",
            "-c",
            "echo kept > /scratch/f && cat /scratch/f && echo $(cat /var/run/secrets/kubernetes.io/serviceaccount/namespace) && test -s /var/run/secrets/kubernetes.io/serviceaccount/token && echo token",
        ],
    );
    assert!(ok, "kubectl exec: {err}");
    assert_eq!(out, "kept\nreal\ntoken\n");

    // An image nobody built fails to pull at once, named in the container's state.
    pods.create(
        &PostParams::default(),
        &pod("missing", "vcp.dev/never-built:1", "true")?,
    )
    .await?;
    let waiting = eventually("an image pull failure", Duration::from_secs(60), || async {
        let p = pods.get("missing").await?;
        Ok(p.status
            .and_then(|s| s.container_statuses)
            .and_then(|c| c.into_iter().next())
            .and_then(|c| c.state?.waiting)
            .filter(|w| {
                matches!(
                    w.reason.as_deref(),
                    Some("ErrImagePull" | "ImagePullBackOff")
                )
            }))
    })
    .await?;
    assert!(
        waiting
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("vcp.dev/never-built:1"),
        "{waiting:?}"
    );

    // Stopping the cluster stops the node and everything it ran, and removes its network.
    let net = std::fs::read_to_string(dir.path().join("node/network.json"))?;
    let index: u8 = serde_json::from_str::<serde_json::Value>(&net)?["index"]
        .as_u64()
        .expect("index")
        .try_into()?;
    let netns = node::NodeNet { index }.netns();
    assert!(std::path::Path::new("/run/netns").join(&netns).exists());
    cluster.stop();
    assert!(
        !std::path::Path::new("/run/netns").join(&netns).exists(),
        "{netns} removed"
    );
    let node_dir = dir.path().join("node").to_string_lossy().into_owned();
    let left: Vec<String> = std::fs::read_dir("/proc")?
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&node_dir))
        .collect();
    assert!(left.is_empty(), "node processes left: {left:?}");
    Ok(())
}
