//! Fleet upgrades on the dev cluster: real tenants with workloads moved 1.36 -> 1.37 in waves
//! through `POST /v1/upgrades` by a real `vcp serve`, their objects kept, their host pods
//! untouched and their apiservers answering throughout; the requests refused; and a replica
//! killed with SIGKILL mid-wave while another finishes, no tenant upgraded twice. The web
//! console is tested in headless Chromium against the first fleet upgrade while it runs (its
//! tenants and upgrade are what the console needs, and a dev cluster of its own would cost
//! minutes of provisioning): see [`the_console_shows_the_fleet_and_acts_through_the_api`].

mod console;

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

use console::{Browser, SHOWN_WITHIN};

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

/// kubectl of the cluster's version with `kubeconfig`, off the test's runtime (the pollers
/// share it): (succeeded, stdout, stderr).
async fn kubectl(
    cluster: &DevCluster,
    kubeconfig: &Path,
    args: &[&str],
) -> anyhow::Result<(bool, String, String)> {
    let kubectl = cluster.kubectl();
    let kubeconfig = kubeconfig.to_owned();
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(kubectl)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .output()?;
        anyhow::Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    })
    .await?
}

/// What the page shows of a fleet upgrade: the wave counter, each tenant's state and the
/// upgrade's (`wave 1 of 2 | fleet-a=Running fleet-b=Pending | Running`); None before it is
/// drawn.
async fn upgrade_shown(b: &Browser) -> anyhow::Result<Option<String>> {
    let v = b
        .client
        .execute(
            "const w = document.querySelector('#wave-counter');
             if (!w) return null;
             const ts = Array.from(document.querySelectorAll('#upgrade-waves tr[data-tenant]'),
               (r) => r.dataset.tenant + '=' + r.querySelector('.fleet-tenant-state').textContent);
             const s = document.querySelector('#upgrade-state');
             return w.textContent + ' | ' + ts.join(' ') + ' | ' + (s ? s.textContent : '');",
            vec![],
        )
        .await?;
    Ok(v.as_str().map(str::to_owned))
}

/// The web console in headless Chromium while fleet upgrade `id` moves fleet-a, then
/// fleet-b, with team-c's `shop` beside them (docs/console.md, "Tests"):
/// - the admin logs in; the fleet shows the three tenants, and the filter narrows them;
/// - the upgrade's page shows the waves advance by itself (polling), and its Pause and
///   Resume buttons pause and resume it through the API;
/// - on shop's page, Revoke (confirmed in the browser's dialog) revokes carol's kubeconfig,
///   and kubectl with it is refused within the documented 60 s; a user named like markup is
///   shown as text;
/// - team-c's token sees only shop, on the page and in every answer the page received
///   (`window.vcpRequests`), and is told plainly that fleet upgrades are not its to see.
///
/// Screenshots of each step are kept in target/test-artifacts/console/.
async fn the_console_shows_the_fleet_and_acts_through_the_api(
    b: &Browser,
    url: &str,
    (admin_token, owner_token): (&str, &str),
    id: i64,
    cluster: &DevCluster,
    carol: &Path,
) -> anyhow::Result<()> {
    let page = format!("{url}/ui");
    b.client.goto(&page).await?;
    b.text_of("#login").await?;
    b.screenshot("login").await?;
    b.log_in(admin_token).await?;
    let rows = "#fleet-table tbody tr";
    let shown = eventually("the fleet table", SHOWN_WITHIN, || async {
        let names = b.attrs(rows, "data-tenant").await?;
        Ok((names.len() >= 3).then_some(names))
    })
    .await?;
    let mut sorted = shown.clone();
    sorted.sort();
    assert_eq!(sorted, ["fleet-a", "fleet-b", "shop"], "{shown:?}");
    let owners = b.attrs(rows, "data-owner").await?;
    assert!(owners.contains(&"team-c".to_owned()), "{owners:?}");
    b.text_of("#fleet-count").await?;
    b.screenshot("fleet-admin").await?;
    b.client
        .find(fantoccini::Locator::Css("#fleet-filter"))
        .await?
        .send_keys("team-c")
        .await?;
    eventually("the filter keeping only shop", SHOWN_WITHIN, || async {
        Ok((b.attrs(rows, "data-tenant").await? == ["shop"]).then_some(()))
    })
    .await?;

    // The fleet upgrade's page follows it without being reloaded.
    b.view(&format!("#/upgrades/{id}")).await?;
    let first = eventually("the fleet upgrade's page", SHOWN_WITHIN, || async {
        upgrade_shown(b).await
    })
    .await?;
    eprintln!("console: upgrade page first shows {first}");
    b.screenshot("upgrade-first").await?;
    // Every distinct thing it shows until the canary is done and wave 2 started, as a person
    // watching it would see it change.
    let mut seen = vec![first];
    let watching = Instant::now();
    let advanced = loop {
        let now = upgrade_shown(b).await?.unwrap_or_default();
        if seen.last() != Some(&now) {
            eprintln!("console: the upgrade page changed to {now}");
            seen.push(now.clone());
        }
        if now.starts_with("wave 2 of 2") && now.contains("fleet-a=Succeeded") {
            break now;
        }
        // A canary's hop takes well under a minute here: a page that stopped polling fails
        // long before the whole fleet's timeout.
        anyhow::ensure!(
            watching.elapsed() < READY_TIMEOUT,
            "the page never showed wave 2 after the canary: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        seen.len() >= 2 && seen[0].starts_with("wave 1 of 2"),
        "the page did not show the waves advancing: {seen:?}"
    );
    b.screenshot("upgrade-wave-2").await?;
    // Pause and resume through the page's buttons (fleet-b's upgrade, a minute or so, is
    // still moving: a pause holds only tenants not started).
    assert!(advanced.ends_with("| Running"), "{advanced}");
    b.click("#upgrade-pause").await?;
    eventually("the upgrade shown Paused", SHOWN_WITHIN, || async {
        Ok(upgrade_shown(b)
            .await?
            .filter(|s| s.ends_with("| Paused"))
            .map(|_| ()))
    })
    .await?;
    b.screenshot("upgrade-paused").await?;
    b.click("#upgrade-resume").await?;
    eventually("the upgrade shown resumed", SHOWN_WITHIN, || async {
        Ok(upgrade_shown(b)
            .await?
            .filter(|s| !s.ends_with("| Paused"))
            .map(|_| ()))
    })
    .await?;

    // shop's page: conditions, timeline, usage, and its kubeconfigs with Revoke.
    b.view("#/tenants/shop?owner=team-c").await?;
    let carol_row = r#"#kubeconfig-table tr[data-user="carol"]"#;
    b.text_of(&format!("{carol_row} button.revoke")).await?;
    let ready = b
        .text_of(r#"#tenant-conditions tr[data-condition="Ready"]"#)
        .await?;
    assert!(ready.contains("True"), "{ready}");
    b.text_of(r#"#timeline-table tr[data-action="kubeconfig.issue"]"#)
        .await?;
    b.text_of("#usage-chart, #usage-empty").await?;
    let markup = b
        .text_of(r#"#kubeconfig-table tr[data-user="<i>x</i>"] td"#)
        .await?;
    assert_eq!(markup, "<i>x</i>", "a user's name is shown as text");
    let elements = b
        .client
        .execute("return document.querySelectorAll('main i').length;", vec![])
        .await?;
    assert_eq!(elements, json!(0), "a user's name became markup");
    b.scroll_to("#tenant-usage").await?;
    b.screenshot("tenant").await?;
    b.click(&format!("{carol_row} button.revoke")).await?;
    let asked = eventually("the confirm dialog", SHOWN_WITHIN, || async {
        Ok(b.client.get_alert_text().await.ok())
    })
    .await?;
    assert!(asked.contains("carol"), "{asked}");
    b.client.accept_alert().await?;
    let revoked_at = Instant::now();
    let notice = b.text_of("#revoke-notice").await?;
    assert!(
        notice.contains("Revoked the kubeconfig of carol"),
        "{notice}"
    );
    let state = b.text_of(&format!("{carol_row} .kubeconfig-state")).await?;
    assert!(state.starts_with("revoked"), "{state}");
    // The page's timeline, read again from the audit trail, has the revocation.
    let entry = b
        .text_of(r#"#timeline-table tr[data-action="kubeconfig.revoke"]"#)
        .await?;
    assert!(
        entry.contains("admin") && entry.contains("carol"),
        "{entry}"
    );
    b.screenshot("revoked").await?;
    let refused = eventually(
        "kubectl with the revoked kubeconfig refused",
        Duration::from_secs(60),
        || async {
            let (ok, _, err) = kubectl(cluster, carol, &["get", "namespaces"]).await?;
            Ok((!ok).then_some(err))
        },
    )
    .await?;
    eprintln!(
        "console: kubectl refused the kubeconfig revoked from the page after {:.1}s: {}",
        revoked_at.elapsed().as_secs_f64(),
        refused.trim()
    );
    assert!(refused.contains("was revoked"), "{refused}");

    // team-c, on a fresh page (its record of requests starts empty).
    b.click("#logout").await?;
    b.text_of("#login").await?;
    b.client.goto(&page).await?;
    b.log_in(owner_token).await?;
    let mine = eventually("the owner's fleet table", SHOWN_WITHIN, || async {
        let names = b.attrs(rows, "data-tenant").await?;
        Ok((!names.is_empty()).then_some(names))
    })
    .await?;
    assert_eq!(mine, ["shop"], "team-c sees only its tenant");
    b.screenshot("fleet-owner").await?;
    b.view("#/tenants/shop").await?;
    b.text_of("#kubeconfig-table").await?;
    b.text_of("#timeline-table").await?;
    b.text_of("#usage-chart, #usage-empty").await?;
    b.view("#/versions").await?;
    b.text_of("#versions-table").await?;
    let counts = b
        .text_of(r#"#versions-table tr[data-minor="1.37"] .tenant-count"#)
        .await?;
    assert_eq!(counts, "1", "team-c's one tenant on 1.37");
    b.view("#/upgrades").await?;
    let told = b.text_of("#upgrades-forbidden").await?;
    assert!(told.contains("not an admin"), "{told}");
    b.screenshot("upgrades-owner").await?;
    b.view(&format!("#/upgrades/{id}")).await?;
    b.text_of("#upgrades-forbidden").await?;
    let requests = b.requests().await?;
    let asked: Vec<String> = requests
        .iter()
        .map(|r| format!("{} {} {}", r["method"], r["url"], r["status"]))
        .collect();
    eprintln!(
        "console: team-c's page made {} requests: {asked:?}",
        requests.len()
    );
    for path in [
        "/v1/tenants",
        "/v1/tenants/shop",
        "/v1/audit",
        "/v1/versions",
        "/v1/upgrades",
    ] {
        assert!(
            requests.iter().any(|r| r["url"]
                .as_str()
                .is_some_and(|u| u == path || u.starts_with(&format!("{path}?")))),
            "the page never asked for {path}: {asked:?}"
        );
    }
    for r in &requests {
        let (url, status, body) = (
            r["url"].as_str().unwrap_or(""),
            r["status"].as_u64().unwrap_or(0),
            r["body"].as_str().unwrap_or(""),
        );
        for other in ["fleet-a", "fleet-b"] {
            assert!(
                !body.contains(other) && !url.contains(other),
                "team-c's page was told of {other}: {r}"
            );
        }
        let want_forbidden = url.starts_with("/v1/upgrades");
        assert_eq!(
            status == 403,
            want_forbidden,
            "{url} answered {status}: {body}"
        );
        if !want_forbidden {
            assert!(
                (200..300).contains(&status),
                "{url} answered {status}: {body}"
            );
        }
    }
    Ok(())
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

    // A third tenant, of another owner, already on the target and not selected (no env=dev
    // label): the console shows the admin all three and its owner only this one.
    let owner = api.new_owner("team-c").await?;
    let owner_token = owner.token().to_owned();
    let (s, b) = owner
        .raw(Method::POST, "/v1/tenants", Some(&json!({"name": "shop"})))
        .await?;
    assert_eq!(s, 201, "{b}");
    let names = ["fleet-a", "fleet-b"];
    let tenants = ready_tenants(api, &names).await?;
    owner.wait_ready("shop", READY_TIMEOUT).await?;
    // The kubeconfig the console revokes, and one whose user is written like markup.
    let carol = p.dir.path().join("carol.kubeconfig");
    std::fs::write(
        &carol,
        owner.kubeconfig("shop", "carol", &["view"], "1h").await?,
    )?;
    owner
        .kubeconfig("shop", "<i>x</i>", &["view"], "1h")
        .await?;
    let (ok, _, err) = kubectl(cluster, &carol, &["get", "namespaces"]).await?;
    assert!(ok, "carol's kubeconfig works before it is revoked: {err}");
    // Started before the fleet upgrade: a missing Chromium fails the test at once.
    let browser = Browser::start().await?;
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

    let console_started = Instant::now();
    the_console_shows_the_fleet_and_acts_through_the_api(
        &browser,
        &p.orchestrator.url,
        (&p.admin_token, &owner_token),
        id,
        cluster,
        &carol,
    )
    .await?;
    browser.close().await?;
    // What the page did is in the audit trail, as the admin's.
    for (action, tenant) in [
        ("fleet.pause", None),
        ("fleet.resume", None),
        ("kubeconfig.revoke", Some("shop")),
    ] {
        let (s, b) = api
            .raw(Method::GET, &format!("/v1/audit?action={action}"), None)
            .await?;
        assert_eq!(s, 200, "{b}");
        let items = b["items"].as_array().cloned().unwrap_or_default();
        assert_eq!(items.len(), 1, "{action}: {b}");
        assert_eq!(items[0]["actor"], "admin", "{action}: {b}");
        if let Some(t) = tenant {
            assert_eq!(items[0]["tenant"], t, "{action}: {b}");
        }
    }
    eprintln!(
        "the console in headless Chromium: {:.1}s, while the fleet upgrade ran",
        console_started.elapsed().as_secs_f64()
    );

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
    // Each selected tenant once (paused and resumed in between); team-c's shop, not selected,
    // never.
    for (name, n) in upgrades_per_tenant(&p.database_url).await? {
        assert_eq!(n, i64::from(name != "shop"), "{name} upgraded {n} times");
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
