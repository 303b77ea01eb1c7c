//! Upgrades on the dev cluster: a real tenant moved 1.35 -> 1.36 -> 1.37 through the API by a
//! real `vcp serve`, its control plane rolled as real processes on the devnode, with its
//! objects kept and its host pods untouched; and the requests the skew rules refuse.

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::Client;
use kube::api::{Api, PostParams};
use reqwest::Method;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use vcp_dev::cluster::DevCluster;
use vcp_dev::platform::ApiClient;
use vcp_dev::testing::eventually;

const READY_TIMEOUT: Duration = Duration::from_secs(240);
const UPGRADE_TIMEOUT: Duration = Duration::from_secs(600);

async fn tenant_client(kubeconfig: &str) -> anyhow::Result<Client> {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(Client::try_from(cfg)?)
}

/// PATCHes the tenant; the status and body.
async fn patch(api: &ApiClient, name: &str, body: Value) -> anyhow::Result<(u16, Value)> {
    api.raw(Method::PATCH, &format!("/v1/tenants/{name}"), Some(&body))
        .await
}

/// Waits until the tenant's upgrade is finished, printing its progress; the tenant.
async fn wait_upgraded(api: &ApiClient, name: &str) -> anyhow::Result<Value> {
    let start = Instant::now();
    let mut last = String::new();
    loop {
        let t = api
            .get_tenant(name)
            .await?
            .ok_or_else(|| anyhow::anyhow!("tenant {name} vanished"))?;
        let u = &t["upgrade"];
        let cond = t["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Upgraded"))
            .map(|c| c["message"].as_str().unwrap_or("").to_owned())
            .unwrap_or_default();
        let now = format!(
            "{} {} {}->{}: {cond}",
            t["phase"], u["state"], u["hop_from"], u["hop_to"]
        );
        if now != last {
            eprintln!("[{:>4}s] {name}: {now}", start.elapsed().as_secs());
            last = now;
        }
        if t["phase"] != "Upgrading" && (u["state"] == "Succeeded" || u["state"] == "RolledBack") {
            return Ok(t);
        }
        anyhow::ensure!(
            start.elapsed() < UPGRADE_TIMEOUT,
            "tenant {name} still upgrading after {UPGRADE_TIMEOUT:?}: {t}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A templates folder for a serve of its own: the built-in templates with this catalog.
fn templates_with(versions: &str) -> anyhow::Result<tempfile::TempDir> {
    let templates = tempfile::tempdir()?;
    vcp_dev::testing::templates_with(templates.path(), |_| versions.to_owned())?;
    Ok(templates)
}

/// The built-in catalog with a 1.37 whose apiserver cannot start (an unknown flag), marked
/// as a storage change if asked.
fn broken_137(storage_change: bool) -> String {
    // The first entry is 1.37.
    let mut versions = include_str!("../../templates/versions.yaml").replacen(
        "apiserver_flags: []",
        "apiserver_flags: [--no-such-flag=broken]",
        1,
    );
    if storage_change {
        versions = versions.replacen(
            "controller_manager_flags: []",
            "controller_manager_flags: []\n    storage_change: true",
            1,
        );
    }
    versions
}

/// A platform over the shared cluster (database `db`) whose catalog has [`broken_137`], with
/// hops that give up after 30 s; the templates folder lives as long as the guard.
async fn broken_platform(
    db: &str,
    storage_change: bool,
) -> anyhow::Result<(vcp_dev::testing::TestPlatform, tempfile::TempDir)> {
    let cluster = DevCluster::shared().await?;
    let templates = templates_with(&broken_137(storage_change))?;
    let p = vcp_dev::testing::platform_with(
        cluster,
        db,
        2,
        vec![
            (
                "VCP_TEMPLATES".into(),
                templates.path().display().to_string(),
            ),
            ("VCP_UPGRADE_HOP_TIMEOUT_SECONDS".into(), "30".into()),
        ],
    )
    .await?;
    Ok((p, templates))
}

/// Tenant `name` on 1.36 created and Ready; its `default` ConfigMaps, as its admin.
async fn ready_tenant(api: &ApiClient, name: &str) -> anyhow::Result<Api<ConfigMap>> {
    let (s, b) = api
        .raw(
            Method::POST,
            "/v1/tenants",
            Some(&json!({"name": name, "version": "1.36"})),
        )
        .await?;
    assert_eq!(s, 201, "{b}");
    api.wait_ready(name, READY_TIMEOUT).await?;
    let tenant = tenant_client(&api.kubeconfig(name, "alice", &["admin"], "1h").await?).await?;
    Ok(Api::namespaced(tenant, "default"))
}

/// One tenant on 1.35 with a ConfigMap and a pod, upgraded by a chain of two hops to 1.37:
/// the refusals first, then the upgrade with a client polling the tenant apiserver throughout.
#[tokio::test]
async fn a_chained_upgrade_keeps_the_tenants_objects_and_host_pods() -> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let p = vcp_dev::testing::platform(cluster, "vcp-upgrade", 2).await?;
    let api = &p.admin;
    let name = "chain";
    let (s, b) = api
        .raw(
            Method::POST,
            "/v1/tenants",
            Some(&json!({"name": name, "version": "1.35"})),
        )
        .await?;
    assert_eq!(s, 201, "{b}");
    let t = api.wait_ready(name, READY_TIMEOUT).await?;
    let key = t["key"].as_str().unwrap().to_owned();
    let tenant = tenant_client(&api.kubeconfig(name, "alice", &["admin"], "1h").await?).await?;
    assert_eq!(tenant.apiserver_version().await?.git_version, "v1.35.4");

    // What the skew rules refuse, each naming its rule, before anything moves.
    for (body, rule) in [
        (json!({"version": "1.37"}), "one-minor-per-hop"),
        (json!({"version": "1.35"}), "unchanged"),
        (json!({"version": "v1.35.4"}), "unchanged"),
    ] {
        let (s, b) = patch(api, name, body.clone()).await?;
        assert_eq!(s, 422, "{body}: {b}");
        assert_eq!(b["field"], "version", "{b}");
        assert!(b["detail"].as_str().unwrap().contains(rule), "{body}: {b}");
    }
    let (s, b) = patch(api, name, json!({"version": "1.12"})).await?;
    assert_eq!((s, b["field"].as_str()), (422, Some("version")), "{b}");
    let (s, b) = patch(api, name, json!({"version": "1.36", "force": true})).await?;
    assert_eq!(s, 422, "an unknown field: {b}");
    assert_eq!(api.get_tenant(name).await?.unwrap()["upgrade"], Value::Null);

    // Objects that must survive, and a host pod that must not be restarted.
    let cms: Api<ConfigMap> = Api::namespaced(tenant.clone(), "default");
    let keep: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "keep"}, "data": {"k": "v"}
    }))?;
    cms.create(&PostParams::default(), &keep).await?;
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "web", "image": "nginx"}]}
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let host = cluster.connect().await?;
    let host_pods: Api<Pod> = Api::namespaced(host, &format!("{key}-default"));
    let before = eventually("the host pod running", Duration::from_secs(60), || async {
        let p = host_pods.get_opt("web").await?;
        let running = p.as_ref().and_then(|p| p.status.as_ref()?.phase.clone());
        Ok(p.filter(|_| running.as_deref() == Some("Running")))
    })
    .await?;

    // A client that keeps asking the tenant apiserver through the whole upgrade.
    let poller = vcp_dev::testing::Poller::start(cms.clone(), "keep");

    let started = Instant::now();
    let (s, b) = patch(api, name, json!({"version": "1.37", "chain": true})).await?;
    assert_eq!(s, 202, "{b}");
    assert_eq!(b["phase"], "Upgrading", "{b}");
    assert_eq!(
        (
            b["upgrade"]["hop_from"].as_str(),
            b["upgrade"]["hop_to"].as_str()
        ),
        (Some("1.35"), Some("1.36"))
    );
    // One upgrade at a time.
    let (s, b) = patch(api, name, json!({"version": "1.36"})).await?;
    assert!(s == 409 || s == 422, "a second upgrade: {s} {b}");

    let t = wait_upgraded(api, name).await?;
    let took = started.elapsed();
    let (ok, failed) = poller.finish().await?;
    eprintln!(
        "upgrade 1.35 -> 1.37 (two hops) took {:.1}s; the polling client saw {failed} failed of {} requests",
        took.as_secs_f64(),
        ok + failed
    );
    assert_eq!(t["upgrade"]["state"], "Succeeded", "{t}");
    assert_eq!(t["phase"], "Ready", "{t}");
    assert_eq!(t["version"], "1.37", "{t}");
    assert_eq!(t["kubernetes_version"], "v1.37.1", "{t}");
    assert!(ok > 0, "the poller never got an answer");

    // One etcd snapshot before each hop, taken on the version the hop started from.
    let (s, l) = api
        .raw(Method::GET, &format!("/v1/tenants/{name}/snapshots"), None)
        .await?;
    assert_eq!(s, 200, "{l}");
    let mut snaps: Vec<&Value> = l["snapshots"].as_array().unwrap().iter().collect();
    snaps.reverse();
    let versions: Vec<_> = snaps.iter().map(|s| s["version"].as_str()).collect();
    assert_eq!(versions, [Some("1.35"), Some("1.36")], "{l}");
    for snap in snaps {
        assert_eq!(snap["state"], "Succeeded", "{snap}");
        assert_eq!(snap["upgrade"], t["upgrade"]["id"], "{snap}");
        assert!(snap["revision"].as_i64().unwrap() > 0, "{snap}");
        assert!(snap["size_bytes"].as_i64().unwrap() > 0, "{snap}");
        assert_eq!(snap["sha256"].as_str().unwrap().len(), 64, "{snap}");
    }

    // The apiserver itself says so, and the tenant kept its objects.
    let tenant = tenant_client(&api.kubeconfig(name, "alice", &["admin"], "1h").await?).await?;
    assert_eq!(tenant.apiserver_version().await?.git_version, "v1.37.1");
    let cms: Api<ConfigMap> = Api::namespaced(tenant.clone(), "default");
    assert_eq!(
        cms.get("keep").await?.data.unwrap()["k"],
        "v",
        "the ConfigMap made before the upgrade"
    );
    assert!(
        Api::<Pod>::namespaced(tenant, "default")
            .get_opt("web")
            .await?
            .is_some()
    );
    // The gate's canary made the round trip: on the host with the last hop's stamp, and
    // marked back on the tenant's object by the syncer.
    let stamp = format!("{}/1.37", t["upgrade"]["id"]);
    let canary = cms.get("vcp-upgrade-canary").await?;
    assert_eq!(
        canary
            .metadata
            .annotations
            .unwrap_or_default()
            .get("vcp.dev/canary-seen"),
        Some(&stamp)
    );
    let host_canary =
        Api::<ConfigMap>::namespaced(cluster.connect().await?, &format!("{key}-default"))
            .get("vcp-upgrade-canary")
            .await?;
    assert_eq!(host_canary.data.unwrap()["upgrade"], stamp);
    // Its host pod is the same pod, never restarted.
    let after = host_pods.get("web").await?;
    assert_eq!(
        after.metadata.uid, before.metadata.uid,
        "the host pod was replaced"
    );
    let restarts = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .map(|c| c.iter().map(|c| c.restart_count).sum::<i32>())
    };
    assert_eq!(
        restarts(&after),
        restarts(&before),
        "the host pod restarted"
    );

    // No way back down.
    let (s, b) = patch(api, name, json!({"version": "1.36"})).await?;
    assert_eq!(s, 422, "{b}");
    assert!(
        b["detail"].as_str().unwrap().contains("no-downgrade"),
        "{b}"
    );
    Ok(())
}

/// A catalog whose 1.37 apiserver cannot start (an unknown flag): the hop is rolled back when
/// its (shortened) timeout ends, the tenant is Ready on 1.36 with its objects, and the reason
/// is in the API and in `vcp tenant get`.
#[tokio::test]
async fn a_hop_whose_apiserver_cannot_start_is_rolled_back() -> anyhow::Result<()> {
    let (p, _templates) = broken_platform("vcp-upgrade-fail", false).await?;
    let api = &p.admin;
    let name = "broken";
    let cms = ready_tenant(api, name).await?;
    let keep: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "keep"}, "data": {"k": "v"}
    }))?;
    cms.create(&PostParams::default(), &keep).await?;

    let (s, b) = patch(api, name, json!({"version": "1.37"})).await?;
    assert_eq!(s, 202, "{b}");
    let t = wait_upgraded(api, name).await?;
    assert_eq!(t["upgrade"]["state"], "RolledBack", "{t}");
    assert_eq!(
        (t["phase"].as_str(), t["version"].as_str()),
        (Some("Ready"), Some("1.36")),
        "{t}"
    );
    let reason = t["upgrade"]["reason"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        reason.contains("1.36 -> 1.37") && reason.contains("not healthy after 30s"),
        "{reason}"
    );
    eprintln!("rolled back: {reason}");

    // The old apiserver serves the tenant's objects.
    let tenant = tenant_client(&api.kubeconfig(name, "alice", &["admin"], "1h").await?).await?;
    assert_eq!(tenant.apiserver_version().await?.git_version, "v1.36.4");
    let cms: Api<ConfigMap> = Api::namespaced(tenant, "default");
    assert_eq!(cms.get("keep").await?.data.unwrap()["k"], "v");

    // The CLI shows why.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_vcp"))
        .args(["tenant", "get", name])
        .env("VCP_API_URL", &p.orchestrator.url)
        .env("VCP_TOKEN", &p.admin_token)
        .output()
        .await?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("RolledBack") && text.contains("not healthy after 30s"),
        "{text}"
    );
    Ok(())
}

/// The same broken 1.37, marked `storage_change` in the catalog: the rollback restores the
/// snapshot taken before the hop, so a ConfigMap created during the hop (through the old
/// apiserver, which keeps serving while the new one cannot start) is gone afterwards, the
/// ones from before are there, and the tenant is Ready on 1.36; the upgrade shows the restore.
#[tokio::test]
async fn a_rollback_of_a_storage_changing_hop_restores_its_snapshot() -> anyhow::Result<()> {
    let (p, _templates) = broken_platform("vcp-upgrade-restore", true).await?;
    let api = &p.admin;
    let name = "storage";
    let cms = ready_tenant(api, name).await?;
    let cm = |n: &str| -> anyhow::Result<ConfigMap> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": n}, "data": {"k": "v"}
        }))?)
    };
    cms.create(&PostParams::default(), &cm("keep")?).await?;

    let (s, b) = patch(api, name, json!({"version": "1.37"})).await?;
    assert_eq!(s, 202, "{b}");
    // Once the hop runs, its snapshot is taken: what is written now is not in it.
    eventually("the hop started", UPGRADE_TIMEOUT, || async {
        let t = api.get_tenant(name).await?.unwrap_or_default();
        Ok((t["upgrade"]["state"] == "Running").then_some(()))
    })
    .await?;
    eventually(
        "a ConfigMap written during the hop",
        Duration::from_secs(60),
        || async {
            match cms.create(&PostParams::default(), &cm("during")?).await {
                Ok(_) => Ok(Some(())),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(Some(())),
                Err(e) => {
                    eprintln!("writing during the hop: {e}");
                    Ok(None)
                }
            }
        },
    )
    .await?;

    let t = wait_upgraded(api, name).await?;
    let u = &t["upgrade"];
    assert_eq!(u["state"], "RolledBack", "{t}");
    assert_eq!(
        (t["phase"].as_str(), t["version"].as_str()),
        (Some("Ready"), Some("1.36")),
        "{t}"
    );
    // The data is the snapshot's: what the hop wrote is gone, what was there before is not.
    let tenant = tenant_client(&api.kubeconfig(name, "alice", &["admin"], "1h").await?).await?;
    assert_eq!(tenant.apiserver_version().await?.git_version, "v1.36.4");
    let cms: Api<ConfigMap> = Api::namespaced(tenant, "default");
    assert_eq!(cms.get("keep").await?.data.unwrap()["k"], "v");
    assert!(
        cms.get_opt("during").await?.is_none(),
        "the ConfigMap written during the hop survived the rollback: the snapshot was not restored"
    );
    assert_eq!(u["restore_state"], "Succeeded", "{t}");
    // The restore is the hop's snapshot's, started by the rollback.
    let (s, l) = api
        .raw(Method::GET, &format!("/v1/tenants/{name}/snapshots"), None)
        .await?;
    assert_eq!(s, 200, "{l}");
    let restore = l["restores"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == u["restore_id"])
        .cloned()
        .unwrap_or_else(|| panic!("no restore {} in {l}", u["restore_id"]));
    let snapshot = &l["snapshots"][0];
    assert_eq!(snapshot["upgrade"], u["id"], "{l}");
    assert_eq!(restore["snapshot"], snapshot["id"], "{l}");
    assert!(
        restore["requested_by"]
            .as_str()
            .unwrap()
            .contains("storage_change"),
        "{restore}"
    );
    Ok(())
}

/// A catalog whose 1.37 has a newer patch, v1.37.2 (on the same built binaries as v1.37.1,
/// which stays listed as an older patch), and two tenants on v1.37.1 with a maintenance window
/// open now: the one that opted into `auto_update: patch` is moved to v1.37.2 by the patch
/// update sweep through an ordinary upgrade (snapshot, gates) and ends Ready; the one that did
/// not stays on v1.37.1.
#[tokio::test]
async fn an_opted_in_tenant_moves_to_the_newest_patch_in_its_window() -> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    // The first entry is 1.37.
    let versions = include_str!("../../templates/versions.yaml")
        .replacen("kubernetes: v1.37.1", "kubernetes: v1.37.2", 1)
        .replacen(
            "controller_manager_flags: []",
            "controller_manager_flags: []\n    patches:\n      - kubernetes: v1.37.1",
            1,
        );
    let templates = templates_with(&versions)?;
    let p = vcp_dev::testing::platform_with(
        cluster,
        "vcp-auto-update",
        2,
        vec![
            (
                "VCP_TEMPLATES".into(),
                templates.path().display().to_string(),
            ),
            ("VCP_AUTO_UPDATE_INTERVAL_SECONDS".into(), "5".into()),
        ],
    )
    .await?;
    let api = &p.admin;
    // A window open now: every day, from a few minutes ago, for two hours.
    let now = time::OffsetDateTime::now_utc() - time::Duration::minutes(5);
    let window = json!({
        "days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"],
        "start": format!("{:02}:{:02}", now.hour(), now.minute()),
        "duration_minutes": 120,
    });
    for (name, auto) in [("auto", Some("patch")), ("manual", None)] {
        let mut body = json!({"name": name, "version": "v1.37.1", "maintenance_window": window});
        if let Some(a) = auto {
            body["auto_update"] = json!(a);
        }
        let (s, b) = api.raw(Method::POST, "/v1/tenants", Some(&body)).await?;
        assert_eq!(s, 201, "{b}");
        assert_eq!(b["kubernetes_version"], "v1.37.1", "{b}");
    }
    for name in ["auto", "manual"] {
        api.wait_ready(name, READY_TIMEOUT).await?;
    }

    // The sweep starts the update; it ends like any upgrade.
    eventually("the patch update started", UPGRADE_TIMEOUT, || async {
        let t = api.get_tenant("auto").await?.unwrap_or_default();
        Ok((!t["upgrade"].is_null()).then_some(()))
    })
    .await?;
    let t = wait_upgraded(api, "auto").await?;
    let u = &t["upgrade"];
    assert_eq!(u["state"], "Succeeded", "{t}");
    assert_eq!(
        (u["hop_from"].as_str(), u["hop_to"].as_str()),
        (Some("1.37"), Some("1.37"))
    );
    assert_eq!(
        (u["hop_from_release"].as_str(), u["hop_to_release"].as_str()),
        (Some("v1.37.1"), Some("v1.37.2")),
        "{t}"
    );
    assert!(
        u["requested_by"]
            .as_str()
            .unwrap()
            .starts_with("auto-update: patch v1.37.1 -> v1.37.2"),
        "{t}"
    );
    assert_eq!(
        (
            t["phase"].as_str(),
            t["version"].as_str(),
            t["kubernetes_version"].as_str()
        ),
        (Some("Ready"), Some("1.37"), Some("v1.37.2")),
        "{t}"
    );
    // Snapshotted before the hop, like any upgrade.
    let (s, l) = api
        .raw(Method::GET, "/v1/tenants/auto/snapshots", None)
        .await?;
    assert_eq!(s, 200, "{l}");
    assert_eq!(l["snapshots"][0]["upgrade"], u["id"], "{l}");
    assert_eq!(l["snapshots"][0]["state"], "Succeeded", "{l}");
    // Its control plane answers.
    let tenant = tenant_client(&api.kubeconfig("auto", "alice", &["admin"], "1h").await?).await?;
    tenant.apiserver_version().await?;

    // The tenant that did not opt in was left alone, through several sweeps since.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let m = api.get_tenant("manual").await?.unwrap();
    assert_eq!(m["upgrade"], Value::Null, "{m}");
    assert_eq!(
        (
            m["kubernetes_version"].as_str(),
            m["auto_update"].as_str(),
            m["auto_update_effective"].as_str()
        ),
        (Some("v1.37.1"), None, Some("off")),
        "{m}"
    );
    // Nothing newer is left for the updated one: no second update.
    let again = api.get_tenant("auto").await?.unwrap();
    assert_eq!(again["upgrade"]["id"], u["id"], "{again}");

    // The CLI shows the setting.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_vcp"))
        .args(["tenant", "get", "auto"])
        .env("VCP_API_URL", &p.orchestrator.url)
        .env("VCP_TOKEN", &p.admin_token)
        .output()
        .await?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("v1.37.2")
            && text
                .lines()
                .any(|l| l.starts_with("Auto:") && l.contains("patch")),
        "{text}"
    );

    // The CLI sets it: its own `off`, then back to the plan's; a value it does not know is
    // refused, naming the field.
    for (arg, own) in [("off", json!("off")), ("plan", Value::Null)] {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_vcp"))
            .args([
                "tenant",
                "update",
                "auto",
                "--auto-update",
                arg,
                "-o",
                "json",
            ])
            .env("VCP_API_URL", &p.orchestrator.url)
            .env("VCP_TOKEN", &p.admin_token)
            .output()
            .await?;
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        let t: Value = serde_json::from_str(&text)?;
        assert_eq!(
            (&t["auto_update"], t["auto_update_effective"].as_str()),
            (&own, Some("off")),
            "{t}"
        );
    }
    let (s, b) = patch(api, "auto", json!({"auto_update": "weekly"})).await?;
    assert_eq!(s, 422, "{b}");
    Ok(())
}
