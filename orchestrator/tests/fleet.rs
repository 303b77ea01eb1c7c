//! Fleet upgrades on the dev cluster: real tenants with workloads moved 1.36 -> 1.37 in waves
//! through `POST /v1/upgrades` by a real `vcp serve`, their objects kept, their host pods
//! untouched and their apiservers answering throughout; the requests refused; and a replica
//! killed with SIGKILL mid-wave while another finishes, no tenant upgraded twice.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service};
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use reqwest::Method;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};
use vcp_dev::cluster::DevCluster;
use vcp_dev::platform::{self, ApiClient};
use vcp_dev::postgres::EphemeralPostgres;
use vcp_dev::testing::{Poller, eventually, replica, templates_with};

const READY_TIMEOUT: Duration = Duration::from_secs(300);
const FLEET_TIMEOUT: Duration = Duration::from_secs(900);

async fn tenant_client(api: &ApiClient, name: &str) -> anyhow::Result<Client> {
    let kc = api.kubeconfig(name, "alice", &["admin"], "2h").await?;
    let kc = kube::config::Kubeconfig::from_yaml(&kc)?;
    let cfg = kube::config::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(Client::try_from(cfg)?)
}

/// The built-in templates with 1.35 expired in the catalog: a server that refuses it as a
/// target and moves its tenants off it.
fn templates_with_expired(dir: &Path) -> anyhow::Result<()> {
    templates_with(dir, |v| v.replace("class: deprecated", "class: expired"))
}

/// What one `vcp` client command did: (exit code, stdout, stderr).
async fn vcp(url: &str, token: &str, args: &[&str]) -> anyhow::Result<(i32, String, String)> {
    vcp_dev::testing::vcp_client(env!("CARGO_BIN_EXE_vcp"), url, token, 120, args).await
}

/// Creates the tenants (on 1.36, labelled env=dev) and waits until all are Ready.
async fn ready_tenants(api: &ApiClient, names: &[&str]) -> anyhow::Result<BTreeMap<String, Value>> {
    for n in names {
        let (s, b) = api
            .raw(
                Method::POST,
                "/v1/tenants",
                Some(&json!({"name": n, "version": "1.36", "labels": {"env": "dev"}})),
            )
            .await?;
        anyhow::ensure!(s == 201, "create {n}: {s} {b}");
    }
    let mut out = BTreeMap::new();
    for n in names {
        out.insert((*n).to_owned(), api.wait_ready(n, READY_TIMEOUT).await?);
    }
    Ok(out)
}

/// A Deployment, a Service, a ConfigMap and a claim in the tenant's `default` namespace.
async fn workloads(tenant: &Client) -> anyhow::Result<()> {
    let pp = PostParams::default();
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "keep"}, "data": {"k": "v"}
    }))?;
    Api::<ConfigMap>::namespaced(tenant.clone(), "default")
        .create(&pp, &cm)
        .await?;
    let deploy: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx"}]}
            }
        }
    }))?;
    Api::<Deployment>::namespaced(tenant.clone(), "default")
        .create(&pp, &deploy)
        .await?;
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}
    }))?;
    Api::<Service>::namespaced(tenant.clone(), "default")
        .create(&pp, &svc)
        .await?;
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }))?;
    Api::<PersistentVolumeClaim>::namespaced(tenant.clone(), "default")
        .create(&pp, &pvc)
        .await?;
    Ok(())
}

/// Every object [`workloads`] made is still there.
async fn workloads_kept(tenant: &Client) -> anyhow::Result<()> {
    let cm = Api::<ConfigMap>::namespaced(tenant.clone(), "default")
        .get("keep")
        .await?;
    anyhow::ensure!(cm.data.unwrap_or_default().get("k").map(String::as_str) == Some("v"));
    Api::<Deployment>::namespaced(tenant.clone(), "default")
        .get("web")
        .await?;
    Api::<Service>::namespaced(tenant.clone(), "default")
        .get("web")
        .await?;
    Api::<PersistentVolumeClaim>::namespaced(tenant.clone(), "default")
        .get("data")
        .await?;
    let pods = Api::<Pod>::namespaced(tenant.clone(), "default")
        .list(&ListParams::default().labels("app=web"))
        .await?;
    anyhow::ensure!(pods.items.len() == 1, "web pods: {}", pods.items.len());
    Ok(())
}

/// The tenant's host pods: name -> (uid, restarts), once the Deployment's pod runs there.
async fn host_pods(host: &Client, key: &str) -> anyhow::Result<BTreeMap<String, (String, i32)>> {
    let pods: Api<Pod> = Api::namespaced(host.clone(), &format!("{key}-default"));
    eventually("the web pod running on the host", READY_TIMEOUT, || async {
        let list = pods.list(&ListParams::default()).await?;
        let running = list
            .items
            .iter()
            .any(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"));
        Ok(running.then(|| {
            list.items
                .iter()
                .map(|p| {
                    let restarts = p
                        .status
                        .as_ref()
                        .and_then(|s| s.container_statuses.as_ref())
                        .map(|c| c.iter().map(|c| c.restart_count).sum())
                        .unwrap_or(0);
                    (
                        p.metadata.name.clone().unwrap_or_default(),
                        (p.metadata.uid.clone().unwrap_or_default(), restarts),
                    )
                })
                .collect()
        }))
    })
    .await
}

/// Polls a fleet upgrade until it is finished with nothing moving, printing its progress.
async fn wait_fleet(api: &ApiClient, id: i64) -> anyhow::Result<Value> {
    let start = Instant::now();
    let mut last = String::new();
    loop {
        let (s, f) = api
            .raw(Method::GET, &format!("/v1/upgrades/{id}"), None)
            .await?;
        anyhow::ensure!(s == 200, "GET fleet upgrade {id}: {s} {f}");
        let p = &f["progress"];
        let tenants: Vec<String> = f["tenants"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                format!(
                    "{}={}",
                    t["name"].as_str().unwrap_or(""),
                    t["state"].as_str().unwrap_or("")
                )
            })
            .collect();
        let now = format!(
            "{} wave {}/{} done {} failed {} running {} [{}]",
            f["state"],
            f["current_wave"],
            f["waves"],
            p["succeeded"],
            p["failed"],
            p["running"],
            tenants.join(" ")
        );
        if now != last {
            eprintln!("[{:>4}s] fleet {id}: {now}", start.elapsed().as_secs());
            last = now;
        }
        let finished =
            ["Succeeded", "Failed", "Cancelled"].contains(&f["state"].as_str().unwrap_or(""));
        if finished && p["running"] == 0 {
            return Ok(f);
        }
        anyhow::ensure!(
            start.elapsed() < FLEET_TIMEOUT,
            "fleet upgrade {id} not done after {FLEET_TIMEOUT:?}: {f}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Tenant upgrades per tenant name, from the inventory: (name, count).
async fn upgrades_per_tenant(db: &str) -> anyhow::Result<Vec<(String, i64)>> {
    let pool = sqlx::PgPool::connect(db).await?;
    Ok(sqlx::query_as(
        "SELECT t.name, count(u.id) FROM tenants t LEFT JOIN tenant_upgrades u ON u.tenant_id = t.id
         GROUP BY t.name ORDER BY t.name",
    )
    .fetch_all(&pool)
    .await?)
}

#[tokio::test]
async fn a_fleet_upgrade_moves_two_tenants_in_waves_keeping_workloads_and_answering()
-> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let templates = tempfile::tempdir()?;
    templates_with_expired(templates.path())?;
    let p = vcp_dev::testing::platform_with(
        cluster,
        "vcp-fleet",
        2,
        vec![(
            "VCP_TEMPLATES".into(),
            templates.path().to_string_lossy().into_owned(),
        )],
    )
    .await?;
    let api = &p.admin;

    // What a fleet upgrade request may not ask for, each a 4xx naming the field.
    for (body, status, field, says) in [
        (
            json!({"target": "1.36", "selector": {"version": "1.37"}}),
            409,
            "selector.version",
            "no-downgrade",
        ),
        (
            json!({"target": "1.37", "selector": {"version": "1.35"}}),
            409,
            "selector.version",
            "one-minor-per-hop",
        ),
        (
            json!({"target": "1.35"}),
            422,
            "target",
            "no-expired-target",
        ),
        (json!({"target": "1.99"}), 422, "target", "unknown version"),
        (
            json!({"target": "1.37", "selector": {"colour": "red"}}),
            422,
            "selector.colour",
            "unknown field",
        ),
        (
            json!({"target": "1.37", "selector": {"labels": "env"}}),
            422,
            "selector.labels",
            "key=value",
        ),
        (
            json!({"target": "1.37", "selector": {"names": ["nobody"]}}),
            404,
            "selector.names",
            "no tenant named",
        ),
        (
            json!({"target": "1.37", "canary": 0}),
            422,
            "canary",
            "1 to",
        ),
    ] {
        let (s, b) = api.raw(Method::POST, "/v1/upgrades", Some(&body)).await?;
        assert_eq!(s, status, "{body}: {b}");
        assert_eq!(b["field"], field, "{body}: {b}");
        assert!(
            b["detail"].as_str().unwrap_or("").contains(says),
            "{body}: {b}"
        );
    }
    // Nothing to upgrade yet.
    let (s, b) = api
        .raw(
            Method::POST,
            "/v1/upgrades",
            Some(&json!({"target": "1.37"})),
        )
        .await?;
    assert_eq!((s, b["field"].as_str()), (409, Some("selector")), "{b}");

    let names = ["fleet-a", "fleet-b"];
    let tenants = ready_tenants(api, &names).await?;
    let host = cluster.connect().await?;
    let mut before = BTreeMap::new();
    let mut pollers = Vec::new();
    for n in names {
        let client = tenant_client(api, n).await?;
        assert_eq!(client.apiserver_version().await?.git_version, "v1.36.4");
        workloads(&client).await?;
        let key = tenants[n]["key"].as_str().unwrap().to_owned();
        let pods = host_pods(&host, &key).await?;
        eprintln!("{n}: host pods before {pods:?}");
        before.insert(n, (key, pods));
        pollers.push((n, Poller::start(Api::namespaced(client, "default"), "keep")));
    }
    // A names-selected tenant already on the target is refused, naming it.
    let (s, b) = api
        .raw(
            Method::POST,
            "/v1/upgrades",
            Some(&json!({"target": "1.36", "selector": {"names": ["fleet-a"]}})),
        )
        .await?;
    assert_eq!(
        (s, b["field"].as_str()),
        (409, Some("selector.names")),
        "{b}"
    );

    let started = Instant::now();
    let (s, f) = api
        .raw(
            Method::POST,
            "/v1/upgrades",
            Some(&json!({"target": "1.37", "selector": {"labels": "env=dev"},
                "canary": 1, "max_parallel": 2, "failure_budget": 0, "soak_seconds": 0})),
        )
        .await?;
    assert_eq!(s, 201, "{f}");
    let id = f["id"].as_i64().unwrap();
    let waves: Vec<(&str, i64)> = f["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap(), t["wave"].as_i64().unwrap()))
        .collect();
    assert_eq!(waves, [("fleet-a", 0), ("fleet-b", 1)], "{f}");
    let (s, list) = api.raw(Method::GET, "/v1/upgrades", None).await?;
    assert_eq!(s, 200);
    assert_eq!(list["items"][0]["id"], id, "{list}");

    let f = wait_fleet(api, id).await?;
    let took = started.elapsed();
    assert_eq!(f["state"], "Succeeded", "{f}");
    assert_eq!(
        (
            f["progress"]["succeeded"].as_i64(),
            f["progress"]["failed"].as_i64()
        ),
        (Some(2), Some(0)),
        "{f}"
    );
    // The canary finished before the next wave started.
    let t = |i: usize, k: &str| {
        time::OffsetDateTime::parse(
            f["tenants"][i][k].as_str().unwrap(),
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap()
    };
    assert!(t(1, "started_at") >= t(0, "finished_at"), "{f}");

    let mut total_failed = 0;
    for (n, poller) in pollers {
        let (ok, failed) = poller.finish().await?;
        eprintln!(
            "{n}: the polling client saw {failed} failed of {} requests",
            ok + failed
        );
        assert!(ok > 0, "{n}: the poller never got an answer");
        total_failed += failed;
    }
    eprintln!(
        "fleet upgrade of 2 tenants 1.36 -> 1.37 took {:.1}s; failed polled requests: {total_failed}",
        took.as_secs_f64()
    );
    for n in names {
        let t = api.get_tenant(n).await?.unwrap();
        assert_eq!(
            (t["phase"].as_str(), t["version"].as_str()),
            (Some("Ready"), Some("1.37")),
            "{t}"
        );
        assert_eq!(
            t["upgrade"]["requested_by"],
            format!("fleet-upgrade/{id}"),
            "{t}"
        );
        let client = tenant_client(api, n).await?;
        assert_eq!(client.apiserver_version().await?.git_version, "v1.37.1");
        workloads_kept(&client).await?;
        let (key, pods) = &before[n];
        let after = host_pods(&host, key).await?;
        assert_eq!(&after, pods, "{n}: host pods replaced or restarted");
    }
    assert_eq!(total_failed, 0, "the tenant apiservers failed requests");
    // The replica counted what its fleet worker did.
    let metrics = reqwest::get(format!("{}/metrics", p.orchestrator.url))
        .await?
        .text()
        .await?;
    assert!(
        metrics.contains("vcp_fleet_tenant_starts_total 2"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.starts_with("vcp_fleet"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Finished: it can no longer be paused.
    let (s, b) = api
        .raw(
            Method::POST,
            &format!("/v1/upgrades/{id}/pause"),
            Some(&json!({})),
        )
        .await?;
    assert_eq!((s, b["field"].as_str()), (409, Some("state")), "{b}");
    for (name, n) in upgrades_per_tenant(&p.database_url).await? {
        assert_eq!(n, 1, "{name} upgraded {n} times");
    }
    Ok(())
}

#[tokio::test]
async fn a_replica_killed_mid_wave_leaves_the_rest_to_another_and_no_tenant_upgraded_twice()
-> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let pg = EphemeralPostgres::start().await?;
    let db = pg.create_database("fleetkill").await?;
    let dir = tempfile::tempdir()?;
    let token = platform::new_token();
    let mut replicas = BTreeMap::new();
    for r in ["ra", "rb"] {
        replicas.insert(r, replica(cluster, dir.path(), &db, &token, r).await?);
    }
    let api_a = ApiClient::new(&replicas["ra"].url, &token);
    let names = ["kill-a", "kill-b"];
    ready_tenants(&api_a, &names).await?;

    let (s, f) = api_a
        .raw(
            Method::POST,
            "/v1/upgrades",
            Some(&json!({"target": "1.37", "canary": 1, "max_parallel": 1, "soak_seconds": 0})),
        )
        .await?;
    assert_eq!(s, 201, "{f}");
    let id = f["id"].as_i64().unwrap();

    // Mid-wave: the canary's upgrade is under way. Kill the replica whose fleet worker
    // started it.
    let pool = sqlx::PgPool::connect(&db).await?;
    let starter = eventually("the canary started", Duration::from_secs(120), || async {
        Ok(sqlx::query_scalar::<_, String>(
            "SELECT actor FROM audit WHERE action = 'fleet.tenant.start' ORDER BY id LIMIT 1",
        )
        .fetch_optional(&pool)
        .await?)
    })
    .await?;
    let victim = if starter.contains("/ra/") { "ra" } else { "rb" };
    let survivor = if victim == "ra" { "rb" } else { "ra" };
    eprintln!("canary started by {starter}; SIGKILL {victim}");
    replicas.get_mut(victim).unwrap().proc.stop(Duration::ZERO);
    let api = ApiClient::new(&replicas[survivor].url, &token);
    let f = wait_fleet(&api, id).await?;
    assert_eq!(f["state"], "Succeeded", "{f}");
    for t in f["tenants"].as_array().unwrap() {
        assert_eq!(t["state"], "Succeeded", "{t}");
    }
    for n in names {
        let t = api.get_tenant(n).await?.unwrap();
        assert_eq!(
            (t["phase"].as_str(), t["version"].as_str()),
            (Some("Ready"), Some("1.37")),
            "{t}"
        );
    }
    for (name, n) in upgrades_per_tenant(&db).await? {
        assert_eq!(n, 1, "{name} upgraded {n} times");
    }
    // The survivor did the rest: the second wave was started by its fleet worker.
    let actors: Vec<String> = sqlx::query_scalar(
        "SELECT actor FROM audit WHERE action = 'fleet.tenant.start' ORDER BY id",
    )
    .fetch_all(&pool)
    .await?;
    eprintln!("tenant starts by: {actors:?}");
    assert_eq!(actors.len(), 2);
    assert!(actors[1].contains(&format!("/{survivor}/")), "{actors:?}");
    Ok(())
}

#[tokio::test]
async fn a_failing_canary_rolls_back_and_stops_the_fleet_at_its_budget_for_api_and_cli()
-> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    // 1.37's apiserver cannot start here: every hop to it fails its gates and rolls back.
    let templates = tempfile::tempdir()?;
    templates_with(templates.path(), |v| {
        v.replacen(
            "apiserver_flags: []",
            "apiserver_flags: [\"--no-such-flag=1\"]",
            1,
        )
    })?;
    let p = vcp_dev::testing::platform_with(
        cluster,
        "vcp-fleet-fail",
        2,
        vec![
            (
                "VCP_TEMPLATES".into(),
                templates.path().to_string_lossy().into_owned(),
            ),
            ("VCP_UPGRADE_HOP_TIMEOUT_SECONDS".into(), "30".into()),
        ],
    )
    .await?;
    let (api, url, token) = (&p.admin, &p.orchestrator.url, &p.admin_token);
    let names = ["bad-a", "bad-b"];
    ready_tenants(api, &names).await?;
    let client = tenant_client(api, "bad-a").await?;
    workloads(&client).await?;

    // Tenant settings through the CLI: a window and an opt-out, then the window removed.
    let (code, out, err) = vcp(
        url,
        token,
        &[
            "tenant",
            "update",
            "bad-b",
            "--maintenance-window",
            "sat,sun 02:00 4h",
            "--fleet-upgrades",
            "include",
            "-o",
            "json",
        ],
    )
    .await?;
    assert_eq!(code, 0, "{err}");
    let t: Value = serde_json::from_str(&out)?;
    assert_eq!(
        t["maintenance_window"],
        json!({"days": ["sat", "sun"], "start": "02:00", "duration_minutes": 240}),
        "{t}"
    );
    let (code, out, err) = vcp(
        url,
        token,
        &[
            "tenant",
            "update",
            "bad-b",
            "--no-maintenance-window",
            "-o",
            "json",
        ],
    )
    .await?;
    assert_eq!(code, 0, "{err}");
    let t: Value = serde_json::from_str(&out)?;
    assert_eq!(
        (t["maintenance_window"].clone(), t["fleet_upgrades"].clone()),
        (Value::Null, json!("include"))
    );

    let poller = Poller::start(Api::namespaced(client.clone(), "default"), "keep");
    // The fleet upgrade through the CLI, followed live: it ends Failed, so the command fails.
    let started = Instant::now();
    let (code, out, err) = vcp(
        url,
        token,
        &[
            "upgrade",
            "create",
            "--to",
            "1.37",
            "--canary",
            "1",
            "--max-parallel",
            "1",
            "--failure-budget",
            "0",
            "--soak-seconds",
            "0",
            "--wait",
            "--timeout",
            "10m",
        ],
    )
    .await?;
    eprintln!(
        "vcp upgrade create --wait ({:.0}s), exit {code}:\n{err}{out}",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("wave 1/2") && err.contains("remaining"),
        "{err}"
    );
    assert!(err.contains("failed: bad-a (1.36 -> 1.37)"), "{err}");
    assert!(
        err.contains("ended Failed") && err.contains("failure budget of 0"),
        "{err}"
    );
    assert!(out.contains("bad-b") && out.contains("Skipped"), "{out}");

    let (_, list) = api.raw(Method::GET, "/v1/upgrades", None).await?;
    let id = list["items"][0]["id"].as_i64().unwrap();
    let (_, f) = api
        .raw(Method::GET, &format!("/v1/upgrades/{id}"), None)
        .await?;
    assert_eq!(f["state"], "Failed", "{f}");
    assert!(
        f["reason"]
            .as_str()
            .unwrap()
            .contains("wave 0: 1 tenants failed"),
        "{f}"
    );
    assert_eq!(f["failures"].as_array().unwrap().len(), 1, "{f}");
    assert_eq!(f["failures"][0]["name"], "bad-a");
    let why = f["failures"][0]["reason"].as_str().unwrap();
    assert!(why.contains("1.36 -> 1.37"), "{why}");
    let b = &f["tenants"][1];
    assert_eq!(
        (b["name"].as_str(), b["state"].as_str()),
        (Some("bad-b"), Some("Skipped")),
        "{f}"
    );
    assert!(b["reason"].as_str().unwrap().contains("stopped"), "{b}");

    // The canary is back on its old version, healthy, with its objects; the other never moved.
    for n in names {
        let t = api.get_tenant(n).await?.unwrap();
        assert_eq!(
            (t["phase"].as_str(), t["version"].as_str()),
            (Some("Ready"), Some("1.36")),
            "{t}"
        );
    }
    let t = api.get_tenant("bad-a").await?.unwrap();
    assert_eq!(t["upgrade"]["state"], "RolledBack", "{t}");
    assert_eq!(t["upgrade"]["reason"].as_str(), Some(why), "{t}");
    assert_eq!(client.apiserver_version().await?.git_version, "v1.36.4");
    workloads_kept(&client).await?;
    let (ok, failed) = poller.finish().await?;
    eprintln!(
        "bad-a: the polling client saw {failed} failed of {} requests",
        ok + failed
    );
    for (name, n) in upgrades_per_tenant(&p.database_url).await? {
        assert_eq!(n, i64::from(name == "bad-a"), "{name}: {n} upgrades");
    }

    // The CLI shows it, with the reason; a finished fleet upgrade cannot be paused.
    let (code, out, err) = vcp(url, token, &["upgrade", "get", &id.to_string()]).await?;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("Failed") && out.contains("bad-a") && out.contains("1.36 -> 1.37"),
        "{out}"
    );
    let (code, out, _) = vcp(url, token, &["upgrade", "list"]).await?;
    assert_eq!(code, 0);
    assert!(
        out.lines().nth(1).is_some_and(|l| l.contains("Failed")),
        "{out}"
    );
    let (code, _, err) = vcp(url, token, &["upgrade", "pause", &id.to_string()]).await?;
    assert_eq!(code, 1);
    assert!(err.contains("409") && err.contains("is Failed"), "{err}");
    Ok(())
}

/// Simulated control planes (`--simulate-control-planes`, what `vcp-dev bench upgrade
/// --simulate` measures): tenants become Ready without an apiserver to ask, and a fleet upgrade
/// of seven keeps its pace, read from the inventory's times: the canary finished before any
/// other tenant started, every wave finished before the next started, and never more than
/// `max_parallel` moved at once.
#[tokio::test]
async fn a_simulated_fleet_keeps_canary_waves_and_max_parallel() -> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let plans = tempfile::tempdir()?;
    let plans_file = plans.path().join("plans.yaml");
    std::fs::write(&plans_file, platform::SIMULATED_PLANS)?;
    let p = vcp_dev::testing::platform_with(
        cluster,
        "vcp-fleet-sim",
        4,
        vec![
            ("VCP_SIMULATE_CONTROL_PLANES".into(), "true".into()),
            (
                "VCP_PLANS".into(),
                plans_file.to_string_lossy().into_owned(),
            ),
        ],
    )
    .await?;
    let api = &p.admin;
    let names = ["s0", "s1", "s2", "s3", "s4", "s5", "s6"];
    ready_tenants(api, &names).await?;
    let (s, f) = api
        .raw(
            Method::POST,
            "/v1/upgrades",
            Some(&json!({"target": "1.37", "canary": 1, "max_parallel": 2,
                "soak_seconds": 0, "respect_maintenance_windows": false})),
        )
        .await?;
    anyhow::ensure!(s == 201, "fleet upgrade: {s} {f}");
    let id = f["id"].as_i64().unwrap_or_default();
    let done = wait_fleet(api, id).await?;
    assert_eq!(done["state"], "Succeeded", "{done}");

    let pool = sqlx::PgPool::connect(&p.database_url).await?;
    type At = time::OffsetDateTime;
    let rows: Vec<(i32, At, At)> = sqlx::query_as(
        "SELECT wave, started_at, finished_at FROM fleet_upgrade_tenants
         WHERE fleet_id = $1 AND state = 'Succeeded' ORDER BY started_at",
    )
    .bind(id)
    .fetch_all(&pool)
    .await?;
    assert_eq!(rows.len(), names.len(), "every tenant succeeded: {rows:?}");
    let waves: Vec<i32> = rows.iter().map(|r| r.0).collect();
    assert_eq!(
        waves,
        [0, 1, 1, 2, 2, 2, 2],
        "canary, then waves of 2 and 4"
    );
    for (w, started, _) in &rows {
        for (earlier, _, finished) in rows.iter().filter(|r| r.0 < *w) {
            assert!(
                finished <= started,
                "a wave-{w} tenant started at {started} before a wave-{earlier} tenant finished at {finished}"
            );
        }
    }
    for (_, started, _) in &rows {
        let moving = rows
            .iter()
            .filter(|(_, s, f)| s <= started && started < f)
            .count();
        assert!(
            moving <= 2,
            "{moving} tenants moving at {started}: {rows:?}"
        );
    }
    Ok(())
}
