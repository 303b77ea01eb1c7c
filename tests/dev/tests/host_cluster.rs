//! The host cluster works as a Kubernetes cluster: real apiserver, kwok nodes, scheduling,
//! pod IPs, dynamic volumes. All tests share one cluster and keep to their own namespace.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use std::collections::HashSet;
use std::time::Duration;
use vcp_dev::DevCluster;
use vcp_dev::testing::{eventually, namespace};

#[tokio::test]
async fn kubectl_lists_the_kwok_nodes_ready_and_reports_the_built_version() -> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let kubectl = |args: &[&str]| {
        std::process::Command::new(cluster.kubectl())
            .args(args)
            .env("KUBECONFIG", cluster.kubeconfig_path())
            .output()
    };
    let out = kubectl(&["get", "nodes", "-o", "json"])?;
    anyhow::ensure!(
        out.status.success(),
        "kubectl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let nodes: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let ready: Vec<&str> = nodes["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| {
            n["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
        })
        .map(|n| n["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        ready,
        ["devnode-0", "kwok-node-0", "kwok-node-1", "kwok-node-2"]
    );

    let out = kubectl(&["version", "-o", "json"])?;
    let version: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let want = vcp_dev::bins::host_kubernetes_version();
    assert_eq!(version["serverVersion"]["gitVersion"], want);
    assert_eq!(version["clientVersion"]["gitVersion"], want);
    Ok(())
}

#[tokio::test]
async fn a_deployment_of_20_replicas_runs_with_distinct_pod_ips() -> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let client = cluster.connect().await?;
    namespace(&client, "replicas").await?;
    let deploy: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "replicas"},
        "spec": {
            "replicas": 20,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx:1.29"}]},
            },
        },
    }))?;
    Api::<Deployment>::namespaced(client.clone(), "replicas")
        .create(&PostParams::default(), &deploy)
        .await?;
    let pods: Api<Pod> = Api::namespaced(client, "replicas");
    let ips = eventually("20 running pods", Duration::from_secs(60), || async {
        let list = pods.list(&ListParams::default().labels("app=web")).await?;
        let running: Vec<_> = list
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .collect();
        Ok((running.len() == 20).then(|| {
            running
                .iter()
                .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
                .collect::<HashSet<_>>()
        }))
    })
    .await?;
    assert_eq!(ips.len(), 20, "pod IPs are not distinct: {ips:?}");
    Ok(())
}

#[tokio::test]
async fn a_pvc_binds_through_the_default_storage_class_and_its_volume_goes_with_it()
-> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let client = cluster.connect().await?;
    namespace(&client, "volumes").await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "volumes");
    let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }))?;
    claims.create(&PostParams::default(), &pvc).await?;
    let volume = eventually("the claim to bind", Duration::from_secs(30), || async {
        let c = claims.get("data").await?;
        let bound = c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        Ok(bound.then(|| c.spec.and_then(|s| s.volume_name)).flatten())
    })
    .await?;
    let pvs: Api<PersistentVolume> = Api::all(client);
    let pv = pvs.get(&volume).await?;
    let path = pv
        .spec
        .as_ref()
        .unwrap()
        .host_path
        .as_ref()
        .unwrap()
        .path
        .clone();
    assert!(
        std::path::Path::new(&path).is_dir(),
        "{path} was not created"
    );
    assert!(path.starts_with(&*cluster.state_dir().to_string_lossy()));

    claims.delete("data", &DeleteParams::default()).await?;
    eventually(
        "the released volume to be deleted",
        Duration::from_secs(30),
        || async { Ok(pvs.get_opt(&volume).await?.is_none().then_some(())) },
    )
    .await?;
    assert!(
        !std::path::Path::new(&path).exists(),
        "{path} outlived its volume"
    );
    Ok(())
}

#[tokio::test]
async fn the_cluster_postgres_accepts_connections() -> anyhow::Result<()> {
    use sqlx::Connection;
    let cluster = DevCluster::shared().await?;
    let mut conn = sqlx::PgConnection::connect(cluster.database_url()).await?;
    let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&mut conn).await?;
    assert_eq!(one, 1);
    Ok(())
}
