//! A burst of pods through the syncer, in a test binary of its own: its load would slow the
//! other end-to-end tests (cargo runs test binaries one after another).

use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, ListParams, PostParams};
use std::time::Duration;
use vcp_dev::DevCluster;
use vcp_dev::tenant::TenantControlPlane;
use vcp_dev::testing::{eventually, namespace, running};

type Res<T = ()> = anyhow::Result<T>;

/// Large enough that a lagging cache shows: 150 did not reproduce the lost-pod bug, 800 did.
const BURST: usize = 800;

#[tokio::test]
async fn a_burst_of_bare_pods_all_run_and_none_is_lost() -> Res {
    // Bare pods have no controller to recreate them: a host pod wrongly collected (a cache
    // lagging behind the controller that created it) would show up as a missing pod here.
    let cluster = DevCluster::shared().await?;
    let cp = TenantControlPlane::start("e2eg").await?;
    // 800 pods: far over the default tenant quota (100), which is not what this test is about.
    let _syncer = cp.start_syncer(cluster, &[&cp.policy_flag("quota: {}")?])?;
    let tenant = cp.connect().await?;
    namespace(&tenant, "burst").await?;
    let sas: Api<ServiceAccount> = Api::namespaced(tenant.clone(), "burst");
    eventually(
        "the default service account",
        Duration::from_secs(30),
        || async { Ok(sas.get_opt("default").await?) },
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "burst");
    futures::future::try_join_all((0..BURST).map(|i| {
        let pods = pods.clone();
        async move {
            let p: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("p-{i}"), "labels": {"app": "burst"}},
                "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
            }))?;
            pods.create(&PostParams::default(), &p).await?;
            Ok::<_, anyhow::Error>(())
        }
    }))
    .await?;
    eventually(
        "every tenant pod running",
        // Generous: other test binaries share the machine's two cores (tests/run-tests.sh).
        Duration::from_secs(300),
        || async {
            let l = pods
                .list(&ListParams::default().labels("app=burst"))
                .await?;
            anyhow::ensure!(
                l.items.len() == BURST,
                "tenant pods were lost: {} of {BURST} left",
                l.items.len()
            );
            Ok((l.items.iter().filter(|p| running(p)).count() == BURST).then_some(()))
        },
    )
    .await?;
    Ok(())
}
