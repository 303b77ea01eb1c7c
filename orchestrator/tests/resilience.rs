//! Crashes and concurrency: `vcp serve` killed (SIGKILL) at several points of provisioning and
//! deletion, two replicas sharing one inventory, and a database restart in the middle.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, ListParams};
use std::time::Duration;
use vcp_dev::cluster::DevCluster;
use vcp_dev::platform::{self, ApiClient};
use vcp_dev::postgres::EphemeralPostgres;
use vcp_dev::testing::{eventually, replica};

const READY: Duration = Duration::from_secs(240);

/// Certificates recorded per (tenant, purpose): each exactly once.
async fn certificate_counts(db: &str) -> anyhow::Result<Vec<(String, String, i64)>> {
    let pool = sqlx::PgPool::connect(db).await?;
    Ok(sqlx::query_as(
        "SELECT t.name, c.purpose, count(*) FROM certificates c JOIN tenants t ON t.id = c.tenant_id
         GROUP BY t.name, c.purpose ORDER BY 1, 2",
    )
    .fetch_all(&pool)
    .await?)
}

async fn host_left(cluster: &DevCluster, key: &str) -> anyhow::Result<Vec<String>> {
    vcp_dev::testing::tenant_namespaces(&cluster.connect().await?, key).await
}

async fn phase(api: &ApiClient, name: &str) -> anyhow::Result<Option<(String, usize)>> {
    Ok(api.get_tenant(name).await?.map(|t| {
        let done = t["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["status"] == "True")
            .count();
        (t["phase"].as_str().unwrap_or_default().to_owned(), done)
    }))
}

#[tokio::test]
async fn a_replica_killed_during_provisioning_and_deletion_converges_without_duplicates()
-> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let host = cluster.connect().await?;
    let pg = EphemeralPostgres::start().await?;
    let db = pg.create_database("crash").await?;
    let dir = tempfile::tempdir()?;
    let token = platform::new_token();
    let mut orch = replica(cluster, dir.path(), &db, &token, "r1").await?;
    let mut api = ApiClient::new(&orch.url, &token);
    api.create_tenant("gamma").await?;

    // Kill after each of the first steps completes, and restart under the same replica id.
    let mut kills = 0;
    for after in [1, 3, 5] {
        eventually(&format!("{after} steps done"), READY, || async {
            Ok(phase(&api, "gamma")
                .await?
                .filter(|(_, done)| *done >= after)
                .map(|_| ()))
        })
        .await?;
        orch.proc.stop(Duration::ZERO);
        kills += 1;
        orch = replica(cluster, dir.path(), &db, &token, "r1").await?;
        api = ApiClient::new(&orch.url, &token);
    }
    let t = api.wait_ready("gamma", READY).await?;
    let key = t["key"].as_str().unwrap().to_owned();
    println!("gamma Ready after {kills} kills");
    for (tenant, purpose, n) in certificate_counts(&db).await? {
        assert_eq!(n, 1, "{tenant}: {purpose} recorded {n} times");
    }
    let secrets = Api::<Secret>::namespaced(host.clone(), &format!("vcp-{key}"));
    for ca in ["ca", "etcd-ca", "front-proxy-ca"] {
        assert!(secrets.get_opt(ca).await?.is_some());
    }

    // Deletion, killed while it runs: the syncer stops first and namespaces take seconds to
    // go, so a second in, the pass is mid-way.
    api.delete_tenant("gamma").await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !host_left(cluster, &key).await?.is_empty(),
        "deletion finished before the kill"
    );
    orch.proc.stop(Duration::ZERO);
    let orch = replica(cluster, dir.path(), &db, &token, "r1").await?;
    let api = ApiClient::new(&orch.url, &token);
    eventually("gamma gone", READY, || async {
        Ok(api.get_tenant("gamma").await?.is_none().then_some(()))
    })
    .await?;
    let left = host_left(cluster, &key).await?;
    assert!(left.is_empty(), "left on the host: {left:?}");
    Ok(())
}

#[tokio::test]
async fn two_replicas_provision_each_tenant_once_and_survive_a_database_restart()
-> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let host = cluster.connect().await?;
    let mut pg = EphemeralPostgres::start().await?;
    let db = pg.create_database("pair").await?;
    let dir = tempfile::tempdir()?;
    let token = platform::new_token();
    let r1 = replica(cluster, dir.path(), &db, &token, "ra").await?;
    let r2 = replica(cluster, dir.path(), &db, &token, "rb").await?;
    let api1 = ApiClient::new(&r1.url, &token);
    let api2 = ApiClient::new(&r2.url, &token);
    api1.create_tenant("delta").await?;
    api2.create_tenant("epsilon").await?;

    // The database goes away and comes back while both replicas work.
    tokio::time::sleep(Duration::from_secs(2)).await;
    pg.restart().await?;

    let mut keys = Vec::new();
    for name in ["delta", "epsilon"] {
        let t = api1.wait_ready(name, READY).await?;
        keys.push(t["key"].as_str().unwrap().to_owned());
    }
    for (tenant, purpose, n) in certificate_counts(&db).await? {
        assert_eq!(n, 1, "{tenant}: {purpose} recorded {n} times");
    }
    for key in &keys {
        // Applied by both replicas or by one: the spec was written once.
        let sts = Api::<StatefulSet>::namespaced(host.clone(), &format!("vcp-{key}"))
            .get("etcd")
            .await?;
        assert_eq!(
            sts.metadata.generation,
            Some(1),
            "etcd of {key} was rewritten"
        );
    }
    let pool = sqlx::PgPool::connect(&db).await?;
    let workers: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT split_part(actor, '/', 2) FROM audit WHERE actor LIKE 'reconciler/%'",
    )
    .fetch_all(&pool)
    .await?;
    println!("passes recorded by replicas: {workers:?}");
    for name in ["delta", "epsilon"] {
        api2.delete_tenant(name).await?;
    }
    for name in ["delta", "epsilon"] {
        eventually(&format!("{name} gone"), READY, || async {
            Ok(api1.get_tenant(name).await?.is_none().then_some(()))
        })
        .await?;
    }
    for key in &keys {
        assert!(host_left(cluster, key).await?.is_empty());
    }
    Ok(())
}

#[tokio::test]
async fn a_reissued_certificate_rolls_the_apiserver_while_it_keeps_answering() -> anyhow::Result<()>
{
    let cluster = DevCluster::shared().await?;
    let host = cluster.connect().await?;
    let pg = EphemeralPostgres::start().await?;
    let db = pg.create_database("renew").await?;
    let dir = tempfile::tempdir()?;
    let token = platform::new_token();
    let orch = replica(cluster, dir.path(), &db, &token, "rr").await?;
    let api = ApiClient::new(&orch.url, &token);
    api.create_tenant("zeta").await?;
    let t = api.wait_ready("zeta", READY).await?;
    let key = t["key"].as_str().unwrap().to_owned();
    let kc = api.kubeconfig("zeta", "ops", &["view"], "1h").await?;
    let tenant = {
        let kc = kube::config::Kubeconfig::from_yaml(&kc)?;
        kube::Client::try_from(
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?,
        )?
    };
    let pool = sqlx::PgPool::connect(&db).await?;
    let serials = || async {
        let v: Vec<String> = sqlx::query_scalar(
            "SELECT serial FROM certificates WHERE purpose = 'apiserver' ORDER BY id",
        )
        .fetch_all(&pool)
        .await?;
        anyhow::Ok(v)
    };
    assert_eq!(serials().await?.len(), 1);

    // Pretend the certificate was issued for another plan (as after an address change) and
    // let the tenant's next check come now instead of in five minutes.
    let secrets = Api::<Secret>::namespaced(host.clone(), &format!("vcp-{key}"));
    secrets
        .patch(
            "apiserver",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"annotations": {"vcp.dev/certificate-spec": "stale"}}})),
        )
        .await?;
    sqlx::query("UPDATE tenants SET next_reconcile_at = now() WHERE name = 'zeta'")
        .execute(&pool)
        .await?;
    sqlx::query("SELECT pg_notify('vcp_tenants', '')")
        .execute(&pool)
        .await?;

    // Ask the tenant apiserver continuously while the new certificate rolls out.
    let namespaces: Api<Namespace> = Api::all(tenant);
    let deployments = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(
        host.clone(),
        &format!("vcp-{key}"),
    );
    let (mut ok, mut failed) = (0, Vec::new());
    let start = std::time::Instant::now();
    loop {
        match namespaces.list(&ListParams::default()).await {
            Ok(_) => ok += 1,
            Err(e) => failed.push(e.to_string()),
        }
        let d = deployments.get("kube-apiserver").await?;
        let st = d.status.unwrap_or_default();
        let rolled = d.metadata.generation == Some(2)
            && st.observed_generation == Some(2)
            && st.updated_replicas == Some(1)
            && st.replicas == Some(1)
            && st.available_replicas == Some(1);
        if serials().await?.len() == 2 && rolled {
            break;
        }
        anyhow::ensure!(start.elapsed() < READY, "no roll after {READY:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A few more requests against the new replica only.
    for _ in 0..10 {
        match namespaces.list(&ListParams::default()).await {
            Ok(_) => ok += 1,
            Err(e) => failed.push(e.to_string()),
        }
    }
    println!(
        "during the roll: {ok} requests answered, {} failed",
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "requests failed during the roll: {failed:?}"
    );
    let s = secrets.get("apiserver").await?;
    assert_ne!(
        s.metadata
            .annotations
            .unwrap_or_default()
            .get("vcp.dev/certificate-spec")
            .map(String::as_str),
        Some("stale")
    );
    Ok(())
}
