//! CA and service-account-key rotation of a tenant, against a real `vcp serve`, a real tenant
//! apiserver and its syncer on the dev cluster, with a tenant pod that really runs (on the
//! devnode, plan `process-workloads`) and calls its apiserver with its own service-account
//! token throughout ([`testing::TokenPoller`]): what a workload sees of a rotation.

use std::time::{Duration, Instant};
use vcp_dev::cluster::DevCluster;
use vcp_dev::platform::PROCESS_WORKLOADS_PLAN;
use vcp_dev::testing::{self, TokenPoller};

/// The NodePort of a tenant's apiserver, from its `endpoint` (`https://127.0.0.1:<port>`).
fn node_port(tenant: &serde_json::Value) -> anyhow::Result<u16> {
    let endpoint = tenant["endpoint"].as_str().unwrap_or_default();
    endpoint
        .rsplit_once(':')
        .and_then(|(_, port)| port.trim_end_matches('/').parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no port in the tenant's endpoint {endpoint:?}"))
}

#[tokio::test]
async fn a_tenant_pod_calls_its_api_with_its_service_account_token() -> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let p = testing::platform(cluster, "vcp-rotation", 2).await?;
    let api = &p.admin;
    api.create_tenant_with_plan("rotor", PROCESS_WORKLOADS_PLAN)
        .await?;
    let t = api.wait_ready("rotor", Duration::from_secs(240)).await?;
    let kubeconfig = p.dir.path().join("rotor.kubeconfig");
    std::fs::write(
        &kubeconfig,
        api.kubeconfig("rotor", "rotor-admin", &["admin"], "2h")
            .await?,
    )?;
    let tenant = vcp_dev::cluster::client_from(&kubeconfig).await?;
    testing::namespace(&tenant, "apps").await?;

    let started = Instant::now();
    let poller = TokenPoller::start(tenant, "apps", node_port(&t)?).await?;
    eprintln!(
        "token poller answered its first call after {:.1}s",
        started.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(20)).await;
    let log = poller.log().await?;
    for first in ["token-poller: ", "ok "] {
        eprintln!(
            "{}",
            log.lines().find(|l| l.starts_with(first)).unwrap_or("")
        );
    }
    assert!(
        log.contains("ok answered=1 failed=0 user=system:serviceaccount:apps:default\n"),
        "the tenant's token, not the host's:\n{log}"
    );
    let counts = poller.stop().await?;
    eprintln!(
        "token poller: {} answered, {} failed",
        counts.answered, counts.failed
    );
    assert!(counts.answered > 0, "{counts:?}");
    assert_eq!(counts.failed, 0, "{:#?}", counts.failures);
    Ok(())
}
