//! The syncer SIGKILLed in the middle of churn converges once restarted, in a test binary of
//! its own (its load would slow the other end-to-end tests).
//!
//! All of the syncer's state lives in the two apiservers, so a process killed at any line must
//! leave nothing that a restart cannot repair: no tenant object without its host object, no
//! host object without its tenant object, no tenant pod stuck terminating.

use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use vcp_core::naming::{ANN_UID, LABEL_TENANT};
use vcp_dev::DevCluster;
use vcp_dev::tenant::TenantControlPlane;
use vcp_dev::testing::{eventually, namespace};

type Res<T = ()> = anyhow::Result<T>;

const NS: &str = "churn";
const HOST_NS: &str = "e2em-churn";
const FLAGS: [&str; 1] = ["--sync-all-configmaps-secrets"];

async fn create_items(tenant: &Client, range: std::ops::Range<usize>) -> Res {
    let cms: Api<ConfigMap> = Api::namespaced(tenant.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), NS);
    futures::future::try_join_all(range.map(|i| {
        let (cms, pods) = (cms.clone(), pods.clone());
        async move {
            let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("cm-{i}"), "labels": {"churn": "yes"}},
                "data": {"i": i.to_string()},
            }))?;
            cms.create(&PostParams::default(), &cm).await?;
            let p: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("pod-{i}"), "labels": {"churn": "yes"}},
                "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
            }))?;
            pods.create(&PostParams::default(), &p).await?;
            anyhow::Ok(())
        }
    }))
    .await?;
    Ok(())
}

async fn delete_items(tenant: &Client, range: std::ops::Range<usize>) -> Res {
    let cms: Api<ConfigMap> = Api::namespaced(tenant.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), NS);
    futures::future::try_join_all(range.map(|i| {
        let (cms, pods) = (cms.clone(), pods.clone());
        async move {
            cms.delete(&format!("cm-{i}"), &DeleteParams::default())
                .await?;
            pods.delete(&format!("pod-{i}"), &DeleteParams::default())
                .await?;
            anyhow::Ok(())
        }
    }))
    .await?;
    Ok(())
}

/// Name -> UID of the churned objects of a kind in the tenant.
async fn tenant_uids<K>(api: &Api<K>) -> Res<BTreeMap<String, String>>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let l = api.list(&ListParams::default().labels("churn=yes")).await?;
    Ok(l.items
        .iter()
        .map(|o| (o.name_any(), o.uid().unwrap_or_default()))
        .collect())
}

/// Name -> tenant UID (from the markers) of this tenant's churned objects of a kind on the host.
async fn host_uids<K>(api: &Api<K>) -> Res<BTreeMap<String, String>>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let l = api
        .list(&ListParams::default().labels(&format!("{LABEL_TENANT}=e2em,churn=yes")))
        .await?;
    Ok(l.items
        .iter()
        .map(|o| {
            let uid = o.annotations().get(ANN_UID).cloned().unwrap_or_default();
            (o.name_any(), uid)
        })
        .collect())
}

#[tokio::test]
async fn a_syncer_killed_during_churn_converges_after_a_restart() -> Res {
    let cluster = DevCluster::shared().await?;
    let host = cluster.connect().await?;
    let cp = TenantControlPlane::start("e2em").await?;
    let mut syncer = cp.start_syncer(cluster, &FLAGS)?;
    let tenant = cp.connect().await?;
    namespace(&tenant, NS).await?;
    let sas: Api<ServiceAccount> = Api::namespaced(tenant.clone(), NS);
    eventually(
        "the default service account",
        Duration::from_secs(30),
        || async { Ok(sas.get_opt("default").await?) },
    )
    .await?;
    let host_pods: Api<Pod> = Api::namespaced(host.clone(), HOST_NS);
    let host_cms: Api<ConfigMap> = Api::namespaced(host.clone(), HOST_NS);
    let tenant_pods: Api<Pod> = Api::namespaced(tenant.clone(), NS);
    let tenant_cms: Api<ConfigMap> = Api::namespaced(tenant.clone(), NS);

    // Churn while the syncer works, and kill it as soon as it has started on it.
    create_items(&tenant, 0..40).await?;
    delete_items(&tenant, 0..10).await?;
    eventually("the syncer at work", Duration::from_secs(60), || async {
        Ok((!host_uids(&host_pods).await?.is_empty()).then_some(()))
    })
    .await?;
    kill(Pid::from_raw(i32::try_from(syncer.pid)?), Signal::SIGKILL)?;
    anyhow::ensure!(
        syncer.stop_and_wait(Duration::from_secs(5)).is_some(),
        "the killed syncer was not reaped"
    );

    // Churn on while it is down: new objects, and deletions of synced and unsynced ones.
    create_items(&tenant, 40..70).await?;
    delete_items(&tenant, 10..20).await?;
    delete_items(&tenant, 60..65).await?;

    // Restart with few workers (more host objects than workers at startup once deadlocked
    // the collector), and churn on while it starts.
    let _syncer = cp.start_syncer(cluster, &[FLAGS[0], "--workers=2"])?;
    create_items(&tenant, 70..80).await?;
    delete_items(&tenant, 35..45).await?;

    // Converged: exactly the surviving objects on both sides, the same instances (UIDs), and
    // no tenant pod left terminating.
    let alive: Vec<usize> = (20..35).chain(45..60).chain(65..80).collect();
    let names = |prefix: &str| -> BTreeSet<String> {
        alive.iter().map(|i| format!("{prefix}-{i}")).collect()
    };
    let (want_pods, want_cms) = (names("pod"), names("cm"));
    let last = std::sync::Mutex::new(String::new());
    let converged = eventually(
        "the host mirrors the tenant exactly",
        Duration::from_secs(240),
        || async {
            let (tp, hp) = (
                tenant_uids(&tenant_pods).await?,
                host_uids(&host_pods).await?,
            );
            let (tc, hc) = (tenant_uids(&tenant_cms).await?, host_uids(&host_cms).await?);
            let keys = |m: &BTreeMap<String, String>| m.keys().cloned().collect::<BTreeSet<_>>();
            let done = keys(&tp) == want_pods && keys(&tc) == want_cms && tp == hp && tc == hc;
            *last.lock().unwrap() = format!(
                "pods: {}\nconfigmaps: {}",
                difference(&tp, &hp, &want_pods),
                difference(&tc, &hc, &want_cms)
            );
            Ok(done.then_some(()))
        },
    )
    .await;
    if let Err(e) = converged {
        anyhow::bail!("{e}\n{}", last.lock().unwrap());
    }
    Ok(())
}

/// What keeps two sides from matching the wanted names, for the failure message.
fn difference(
    tenant: &BTreeMap<String, String>,
    host: &BTreeMap<String, String>,
    want: &BTreeSet<String>,
) -> String {
    let extra: Vec<&String> = tenant.keys().filter(|k| !want.contains(*k)).collect();
    let missing: Vec<&String> = want.iter().filter(|k| !tenant.contains_key(*k)).collect();
    let mismatched: Vec<String> = tenant
        .iter()
        .filter(|(k, v)| host.get(*k) != Some(v))
        .map(|(k, _)| k.clone())
        .chain(
            host.keys()
                .filter(|k| !tenant.contains_key(*k))
                .map(|k| format!("host-only {k}")),
        )
        .collect();
    format!("tenant extra {extra:?}, tenant missing {missing:?}, not mirrored {mismatched:?}")
}
