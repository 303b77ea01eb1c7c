//! Snapshots and restores on the dev cluster: a real tenant's etcd snapshotted by a Job
//! through etcd's snapshot API onto a claim, then restored by admins, with the objects deleted
//! after the snapshot back and the ones created after it gone; and what the API refuses.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use reqwest::Method;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use vcp_dev::cluster::DevCluster;
use vcp_dev::platform::ApiClient;
use vcp_dev::testing::eventually;

const READY_TIMEOUT: Duration = Duration::from_secs(240);
const DONE_TIMEOUT: Duration = Duration::from_secs(300);

async fn tenant_client(kubeconfig: &str) -> anyhow::Result<Client> {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(Client::try_from(cfg)?)
}

async fn list(api: &ApiClient, name: &str) -> anyhow::Result<Value> {
    let (s, l) = api
        .raw(Method::GET, &format!("/v1/tenants/{name}/snapshots"), None)
        .await?;
    anyhow::ensure!(s == 200, "list: {s} {l}");
    Ok(l)
}

fn config_map(name: &str) -> anyhow::Result<ConfigMap> {
    Ok(serde_json::from_value(
        json!({"metadata": {"name": name}, "data": {"k": name}}),
    )?)
}

#[tokio::test]
async fn a_restore_brings_back_what_was_deleted_after_the_snapshot() -> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let p = vcp_dev::testing::platform(cluster, "vcp-snapshot", 2).await?;
    let api = &p.admin;
    let name = "snap";
    api.create_tenant(name).await?;
    api.wait_ready(name, READY_TIMEOUT).await?;
    let kubeconfig = api.kubeconfig(name, "alice", &["admin"], "1h").await?;
    let cms: Api<ConfigMap> = Api::namespaced(tenant_client(&kubeconfig).await?, "default");
    for n in ["kept", "deleted-after"] {
        cms.create(&PostParams::default(), &config_map(n)?).await?;
    }

    // A snapshot, taken by the tenant's next pass.
    let started = Instant::now();
    let (s, snap) = api
        .raw(Method::POST, &format!("/v1/tenants/{name}/snapshots"), None)
        .await?;
    assert_eq!(
        (s, snap["state"].as_str()),
        (202, Some("Pending")),
        "{snap}"
    );
    let id = snap["id"].as_i64().unwrap();
    let snap = eventually("the snapshot taken", DONE_TIMEOUT, || async {
        let l = list(api, name).await?;
        let s = l["snapshots"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == id)
            .cloned()
            .unwrap();
        anyhow::ensure!(s["state"] != "Failed", "the snapshot failed: {s}");
        Ok((s["state"] == "Succeeded").then_some(s))
    })
    .await?;
    eprintln!(
        "snapshot {id} taken in {:.1}s: revision {}, {} bytes, sha256 {}",
        started.elapsed().as_secs_f64(),
        snap["revision"],
        snap["size_bytes"],
        snap["sha256"]
    );
    assert!(snap["revision"].as_i64().unwrap() > 0, "{snap}");
    assert!(snap["size_bytes"].as_i64().unwrap() > 4096, "{snap}");
    assert_eq!(snap["sha256"].as_str().unwrap().len(), 64, "{snap}");
    assert_eq!(snap["kind"], "etcd", "{snap}");
    let location = snap["location"].as_str().unwrap();
    assert!(
        location.starts_with("pvc://")
            && location.ends_with(&format!("/etcd-snapshots/snapshot-{id}.db")),
        "{location}"
    );

    // What changes after it.
    cms.delete("deleted-after", &DeleteParams::default())
        .await?;
    cms.create(&PostParams::default(), &config_map("created-after")?)
        .await?;

    // Refusals: an owner may not restore; a snapshot that is not this tenant's taken one.
    let (s, b) = p
        .admin
        .raw(
            Method::POST,
            "/v1/tokens",
            Some(&json!({"name": "owner-1", "role": "owner"})),
        )
        .await?;
    assert_eq!(s, 201, "{b}");
    let owner = api.with_token(b["token"].as_str().unwrap());
    let restore = |body: Value| {
        let path = format!("/v1/tenants/{name}/restore");
        async move { api.raw(Method::POST, &path, Some(&body)).await }
    };
    let (s, b) = owner
        .raw(
            Method::POST,
            &format!("/v1/tenants/{name}/restore"),
            Some(&json!({"snapshot": id})),
        )
        .await?;
    assert_eq!(s, 404, "another owner's tenant is not there for them: {b}");
    for body in [json!({"snapshot": id + 1000}), json!({"snapshot": "x"})] {
        let (s, b) = restore(body.clone()).await?;
        assert!(s == 422 || s == 400, "{body}: {s} {b}");
    }

    // The restore: the tenant goes down, its etcd comes back with the snapshot's data.
    let started = Instant::now();
    let (s, r) = restore(json!({"snapshot": id})).await?;
    assert_eq!((s, r["state"].as_str()), (202, Some("Running")), "{r}");
    let (s, b) = restore(json!({"snapshot": id})).await?;
    assert_eq!(s, 409, "one restore at a time: {b}");
    assert_eq!(api.get_tenant(name).await?.unwrap()["phase"], "Restoring");
    let rid = r["id"].clone();
    let last = std::sync::Mutex::new(String::new());
    let r = eventually("the restore finished", DONE_TIMEOUT, || async {
        let t = api.get_tenant(name).await?.unwrap();
        let l = list(api, name).await?;
        let r = l["restores"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == rid)
            .cloned()
            .unwrap();
        let cond = t["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Restored"))
            .map(|c| c["message"].to_string())
            .unwrap_or_default();
        let now = format!("{} {} {cond}", t["phase"], r["state"]);
        let mut last = last.lock().unwrap();
        if now != *last {
            eprintln!("[{:>4}s] {now}", started.elapsed().as_secs());
            *last = now;
        }
        drop(last);
        anyhow::ensure!(r["state"] != "Failed", "the restore failed: {r}");
        Ok((r["state"] == "Succeeded" && t["phase"] == "Ready").then_some(r))
    })
    .await?;
    eprintln!(
        "restore of snapshot {id} took {:.1}s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(r["restored"], true, "{r}");

    let cms: Api<ConfigMap> = Api::namespaced(tenant_client(&kubeconfig).await?, "default");
    let names = eventually(
        "the restored objects served",
        Duration::from_secs(60),
        || async {
            Ok(cms.list(&Default::default()).await.ok().map(|l| {
                l.items
                    .into_iter()
                    .filter_map(|c| c.metadata.name)
                    .collect::<Vec<_>>()
            }))
        },
    )
    .await?;
    assert!(names.contains(&"kept".to_owned()), "{names:?}");
    assert!(
        names.contains(&"deleted-after".to_owned()),
        "deleted after the snapshot, back: {names:?}"
    );
    assert!(
        !names.contains(&"created-after".to_owned()),
        "created after the snapshot, gone: {names:?}"
    );
    // The restored store still takes writes (its revision moved forward, past every client's).
    cms.create(&PostParams::default(), &config_map("after-restore")?)
        .await?;
    Ok(())
}
