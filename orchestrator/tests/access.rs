//! Access that can be taken back, against a real `vcp serve`, a real tenant apiserver and its
//! syncer on the dev cluster: a revoked kubeconfig is refused by unmodified kubectl within
//! 60 s while the tenant's other kubeconfigs keep working, revoking a user ends all of its
//! kubeconfigs, every revocation is in the audit trail, and with vcp stopped for two minutes
//! nothing changes for anyone (the revocations are enforced by the authorizer in the tenant
//! apiserver's pod); with the syncer scaled to 0 as well a revoked kubeconfig stays refused,
//! and a hung authorizer refuses vcp's kubeconfigs but not break-glass.

use reqwest::Method;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use vcp_dev::cluster::DevCluster;
use vcp_dev::testing;

/// The bound the issue sets on a revocation.
const REVOKED_WITHIN: Duration = Duration::from_secs(60);

/// kubectl with a kubeconfig: (succeeded, stderr).
fn kubectl(cluster: &DevCluster, kubeconfig: &Path, args: &[&str]) -> (bool, String) {
    let (ok, _, err) = testing::kubectl_with(cluster, kubeconfig, args);
    (ok, err)
}

async fn vcp(url: &str, token: &str, args: &[&str]) -> anyhow::Result<(i32, String, String)> {
    testing::vcp_client(env!("CARGO_BIN_EXE_vcp"), url, token, 80, args).await
}

/// Waits until kubectl with `kubeconfig` is refused; the delay and kubectl's message.
async fn refused_after(
    cluster: &DevCluster,
    kubeconfig: &Path,
    since: Instant,
) -> anyhow::Result<(Duration, String)> {
    loop {
        let (ok, err) = kubectl(cluster, kubeconfig, &["get", "namespaces"]);
        if !ok {
            return Ok((since.elapsed(), err));
        }
        anyhow::ensure!(
            since.elapsed() < REVOKED_WITHIN + Duration::from_secs(30),
            "{} still works {:?} after its revocation",
            kubeconfig.display(),
            since.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn revoked_kubeconfigs_are_refused_within_a_minute_and_the_rest_work_with_vcp_stopped()
-> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let mut p = testing::platform(cluster, "vcp-access", 2).await?;
    let (url, token) = (p.orchestrator.url.clone(), p.admin_token.clone());
    let api = p.admin.clone();
    api.create_tenant("keys").await?;
    api.wait_ready("keys", Duration::from_secs(240)).await?;

    let dir = p.dir.path().to_owned();
    let issue = |user: &'static str, group: &'static str, file: &'static str| {
        let (api, path) = (api.clone(), dir.join(file));
        async move {
            let kc = api.kubeconfig("keys", user, &[group], "2h").await?;
            std::fs::write(&path, kc)?;
            anyhow::Ok(path)
        }
    };
    let alice = issue("alice", "edit", "alice").await?;
    let bob = issue("bob", "view", "bob").await?;
    let carol: Vec<PathBuf> = vec![
        issue("carol", "view", "carol-1").await?,
        issue("carol", "edit", "carol-2").await?,
    ];
    for kc in [&alice, &bob, &carol[0], &carol[1]] {
        let (ok, err) = kubectl(cluster, kc, &["get", "namespaces"]);
        assert!(ok, "{}: {err}", kc.display());
    }
    let list = api
        .raw(Method::GET, "/v1/tenants/keys/kubeconfigs", None)
        .await?
        .1;
    let serial_of = |user: &str| -> Vec<String> {
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|k| k["user"] == user)
            .map(|k| k["serial"].as_str().unwrap().to_owned())
            .collect()
    };
    let alice_serial = serial_of("alice").remove(0);

    // One kubeconfig, through the CLI.
    let t0 = Instant::now();
    let (code, out, err) = vcp(
        &url,
        &token,
        &["kubeconfig", "revoke", "keys", &alice_serial],
    )
    .await?;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!("revoked kubeconfig {alice_serial} of user alice")),
        "{out}"
    );
    let (delay, message) = refused_after(cluster, &alice, t0).await?;
    println!(
        "revoked kubeconfig refused by kubectl after {delay:?}: {}",
        message.trim()
    );
    assert!(delay < REVOKED_WITHIN, "{delay:?}");
    assert!(message.contains("was revoked"), "{message}");
    let (ok, err) = kubectl(cluster, &bob, &["get", "namespaces"]);
    assert!(ok, "another user's kubeconfig still works: {err}");

    // Every kubeconfig of a user.
    let t0 = Instant::now();
    let (code, out, err) = vcp(
        &url,
        &token,
        &["user", "revoke", "keys", "carol", "-o", "json"],
    )
    .await?;
    assert_eq!(code, 0, "{out}{err}");
    let answer: Value = serde_json::from_str(&out)?;
    let items = answer["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{answer}");
    assert!(
        items.iter().all(|k| k["revoked_at"].is_string()),
        "{answer}"
    );
    for kc in &carol {
        let (delay, _) = refused_after(cluster, kc, t0).await?;
        println!("user revoked: {} refused after {delay:?}", kc.display());
        assert!(delay < REVOKED_WITHIN, "{delay:?}");
    }
    assert!(kubectl(cluster, &bob, &["get", "namespaces"]).0);

    // The listing says which are revoked; revoking again answers the same; unknown ones 404.
    let list = api
        .raw(Method::GET, "/v1/tenants/keys/kubeconfigs", None)
        .await?
        .1;
    for k in list["items"].as_array().unwrap() {
        assert_eq!(k["revoked_at"].is_string(), k["user"] != "bob", "{k}");
    }
    let again = api
        .raw(
            Method::DELETE,
            &format!("/v1/tenants/keys/kubeconfigs/{alice_serial}"),
            None,
        )
        .await?;
    assert_eq!(again.0, 200, "{again:?}");
    assert_eq!(
        again.1["revoked_at"],
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["user"] == "alice")
            .unwrap()["revoked_at"]
    );
    for path in [
        "/v1/tenants/keys/kubeconfigs/00ff".to_owned(),
        "/v1/tenants/keys/kubeconfigs/NOT-HEX".to_owned(),
        "/v1/tenants/keys/users/nobody".to_owned(),
        "/v1/tenants/keys/users/system:admin".to_owned(),
        format!("/v1/tenants/other/kubeconfigs/{alice_serial}"),
    ] {
        let (status, body) = api.raw(Method::DELETE, &path, None).await?;
        assert_eq!(status, 404, "{path}: {body}");
    }
    // Another owner does not learn the tenant exists.
    let owner = api
        .raw(
            Method::POST,
            "/v1/tokens",
            Some(&serde_json::json!({"name": "stranger", "role": "owner"})),
        )
        .await?
        .1;
    let stranger = api.with_token(owner["token"].as_str().unwrap());
    let (status, _) = stranger
        .raw(Method::DELETE, "/v1/tenants/keys/users/bob", None)
        .await?;
    assert_eq!(status, 404);
    assert!(kubectl(cluster, &bob, &["get", "namespaces"]).0);

    // The audit trail, in order, with the actor.
    let audit = api
        .raw(Method::GET, "/v1/audit?tenant=keys&limit=100", None)
        .await?
        .1;
    let actions: Vec<(&str, &str)> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["action"].as_str().unwrap(), e["actor"].as_str().unwrap()))
        .filter(|(a, _)| a.starts_with("kubeconfig.") || a.starts_with("user."))
        .collect();
    assert_eq!(
        actions.iter().map(|(a, _)| *a).collect::<Vec<_>>(),
        [
            "kubeconfig.issue",
            "kubeconfig.issue",
            "kubeconfig.issue",
            "kubeconfig.issue",
            "kubeconfig.revoke",
            "user.revoke"
        ],
        "{audit}"
    );
    let tokens = api.raw(Method::GET, "/v1/tokens", None).await?.1;
    let admin_name = tokens["items"][0]["name"].as_str().unwrap().to_owned();
    assert!(
        actions.iter().all(|(_, actor)| *actor == admin_name),
        "{audit}"
    );

    // Break-glass: admins only, a plain short-lived system:masters certificate, audited with
    // its reason, not revocable.
    let glass = dir.join("glass");
    let (code, out, err) = vcp(
        &url,
        &token,
        &[
            "kubeconfig",
            "break-glass",
            "keys",
            "--reason",
            "syncer drill",
            "--ttl",
            "15m",
            "-o",
            glass.to_str().unwrap(),
        ],
    )
    .await?;
    assert_eq!(code, 0, "{out}{err}");
    let whoami = std::process::Command::new(cluster.kubectl())
        .arg("--kubeconfig")
        .arg(&glass)
        .args(["auth", "whoami", "-o", "json"])
        .output()?;
    let whoami: Value = serde_json::from_slice(&whoami.stdout)?;
    assert_eq!(
        whoami["status"]["userInfo"]["username"],
        format!("vcp:break-glass:{admin_name}"),
        "{whoami}"
    );
    let groups = whoami["status"]["userInfo"]["groups"].to_string();
    assert!(
        groups.contains("system:masters") && !groups.contains("vcp:kubeconfig:"),
        "{groups}"
    );
    let list = api
        .raw(Method::GET, "/v1/tenants/keys/kubeconfigs", None)
        .await?
        .1;
    let glass_row = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["break_glass"] == true)
        .unwrap()
        .clone();
    let (status, body) = api
        .raw(
            Method::DELETE,
            &format!(
                "/v1/tenants/keys/kubeconfigs/{}",
                glass_row["serial"].as_str().unwrap()
            ),
            None,
        )
        .await?;
    assert_eq!(
        (
            status,
            body["type"]
                .as_str()
                .unwrap_or_default()
                .ends_with("break-glass")
        ),
        (409, true),
        "{body}"
    );
    let audit = api
        .raw(Method::GET, "/v1/audit?action=kubeconfig.break-glass", None)
        .await?
        .1;
    assert_eq!(
        audit["items"][0]["detail"]["reason"], "syncer drill",
        "{audit}"
    );
    assert_eq!(audit["items"][0]["actor"], admin_name.as_str(), "{audit}");
    let (status, body) = api
        .raw(
            Method::POST,
            "/v1/tenants/keys/break-glass",
            Some(&serde_json::json!({"reason": "x", "ttl": "2h"})),
        )
        .await?;
    assert_eq!(status, 201, "{body}");
    let expires = time::OffsetDateTime::parse(
        body["expires_at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )?;
    let left = expires - time::OffsetDateTime::now_utc();
    assert!(
        left <= time::Duration::hours(1),
        "2h asked, cut to 1h: {left}"
    );
    let (status, body) = api
        .raw(
            Method::POST,
            "/v1/tenants/keys/break-glass",
            Some(&serde_json::json!({"reason": "", "ttl": "10m"})),
        )
        .await?;
    assert_eq!(
        (status, body["field"].as_str()),
        (422, Some("reason")),
        "{body}"
    );
    // An owner may not, even for its own tenant (which need not be Ready).
    let (status, body) = stranger
        .raw(
            Method::POST,
            "/v1/tenants",
            Some(&serde_json::json!({"name": "mine"})),
        )
        .await?;
    assert_eq!(status, 201, "{body}");
    let (status, body) = stranger
        .raw(
            Method::POST,
            "/v1/tenants/mine/break-glass",
            Some(&serde_json::json!({"reason": "x"})),
        )
        .await?;
    assert_eq!(status, 403, "{body}");
    stranger
        .raw(Method::DELETE, "/v1/tenants/mine", None)
        .await?;

    // vcp stopped for two minutes: the tenant enforces what it was told, and everyone else works.
    let bob_client = {
        let kc = kube::config::Kubeconfig::from_yaml(&std::fs::read_to_string(&bob)?)?;
        kube::Client::try_from(
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?,
        )?
    };
    let poller = testing::Poller::start(
        kube::Api::namespaced(bob_client, "kube-system"),
        "extension-apiserver-authentication",
    );
    p.orchestrator.proc.stop(Duration::from_secs(5));
    let stopped = Instant::now();
    let mut alice_refused = 0;
    while stopped.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(!kubectl(cluster, &alice, &["get", "namespaces"]).0);
        alice_refused += 1;
    }
    let (ok, err) = kubectl(cluster, &glass, &["get", "clusterroles"]);
    assert!(ok, "break-glass with vcp stopped: {err}");
    let (answered, failed) = poller.finish().await?;
    println!(
        "vcp stopped {:?}: bob's requests answered {answered}, failed {failed}; alice refused {alice_refused} times out of {alice_refused}",
        stopped.elapsed()
    );
    assert!(answered > 100, "{answered}");
    assert_eq!(failed, 0);
    Ok(())
}

/// A tenant once Ready that a later pass found not ready (Provisioning, as a pass that meets a
/// refused connection leaves it) still gets its owner's kubeconfigs. (CI on 5122a78: charted's
/// periodic pass met a refused connection under load, and the kubeconfig asked for next was
/// refused 409.) The phase is set in the inventory, out of any worker's reach for the while,
/// so the request meets it for certain; then the tenant is handed back, due at once.
async fn provisioning_again_still_issues_kubeconfigs(
    api: &vcp_dev::platform::ApiClient,
    database_url: &str,
    name: &str,
) -> anyhow::Result<()> {
    let db = sqlx::PgPool::connect(database_url).await?;
    let held = sqlx::query(
        "UPDATE tenants SET phase = 'Provisioning', next_reconcile_at = now() + interval '1 hour'
         WHERE name = $1 AND lease_owner IS NULL AND phase = 'Ready'",
    )
    .bind(name)
    .execute(&db)
    .await?;
    assert_eq!(
        held.rows_affected(),
        1,
        "{name} is Ready and no pass holds it"
    );
    let (status, body) = api
        .raw(
            Method::POST,
            &format!("/v1/tenants/{name}/kubeconfigs"),
            Some(&serde_json::json!({"user": "between-passes", "ttl": "10m"})),
        )
        .await?;
    let t = api.get_tenant(name).await?.unwrap_or_default();
    assert_eq!(t["phase"], "Provisioning", "{t}");
    assert_eq!(status, 201, "a kubeconfig of a tenant once Ready: {body}");
    sqlx::query("UPDATE tenants SET phase = 'Ready', next_reconcile_at = now() WHERE name = $1")
        .bind(name)
        .execute(&db)
        .await?;
    Ok(())
}

/// The tenant's syncer scaled to 0 for two minutes (vcp stopped first, so nothing scales it
/// back): a revoked admin kubeconfig is refused every time it is tried, once a second, as the
/// security review's Secret write was not; the tenant's other kubeconfigs and a break-glass
/// one keep working. The revocations are enforced by an authorizer in the apiserver's own
/// pod, which the syncer's outage does not touch.
#[tokio::test]
async fn a_revoked_kubeconfig_stays_refused_while_the_syncer_is_down() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Pod;
    let cluster = DevCluster::shared().await?;
    let mut p = testing::platform(cluster, "vcp-syncer-down", 2).await?;
    let api = p.admin.clone();
    api.create_tenant("down").await?;
    let tenant = api.wait_ready("down", Duration::from_secs(240)).await?;
    let ns = format!("vcp-{}", tenant["key"].as_str().unwrap());
    assert!(tenant["first_ready_at"].is_string(), "{tenant}");
    provisioning_again_still_issues_kubeconfigs(&api, &p.database_url, "down").await?;
    let dir = p.dir.path().to_owned();
    let write = |file: &str, kubeconfig: String| {
        let path = dir.join(file);
        std::fs::write(&path, kubeconfig)?;
        anyhow::Ok(path)
    };
    let mallory = write(
        "mallory",
        api.kubeconfig("down", "mallory", &["admin"], "2h").await?,
    )?;
    let dana = write(
        "dana",
        api.kubeconfig("down", "dana", &["view"], "2h").await?,
    )?;
    let (status, body) = api
        .raw(
            Method::POST,
            "/v1/tenants/down/break-glass",
            Some(&serde_json::json!({"reason": "syncer outage drill", "ttl": "15m"})),
        )
        .await?;
    assert_eq!(status, 201, "{body}");
    let glass = write("glass", body["kubeconfig"].as_str().unwrap().to_owned())?;
    let list = api
        .raw(Method::GET, "/v1/tenants/down/kubeconfigs", None)
        .await?
        .1;
    let serial = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["user"] == "mallory")
        .unwrap()["serial"]
        .as_str()
        .unwrap()
        .to_owned();
    let t0 = Instant::now();
    let (status, body) = api
        .raw(
            Method::DELETE,
            &format!("/v1/tenants/down/kubeconfigs/{serial}"),
            None,
        )
        .await?;
    assert_eq!(status, 200, "{body}");
    let (delay, _) = refused_after(cluster, &mallory, t0).await?;
    println!("revoked kubeconfig refused after {delay:?}");

    p.orchestrator.proc.stop(Duration::from_secs(5));
    let (ok, _, err) = testing::kubectl_with(
        cluster,
        cluster.kubeconfig_path(),
        &["-n", &ns, "scale", "deployment/vcp-syncer", "--replicas=0"],
    );
    assert!(ok, "{err}");
    let pods: kube::Api<Pod> = kube::Api::namespaced(cluster.client(), &ns);
    testing::eventually("the syncer's pod is gone", Duration::from_secs(90), || {
        let pods = pods.clone();
        async move {
            let list = pods.list(&Default::default()).await?;
            let left = list.items.iter().any(|p| {
                p.metadata
                    .name
                    .as_deref()
                    .unwrap_or("")
                    .starts_with("vcp-syncer-")
            });
            anyhow::Ok((!left).then_some(()))
        }
    })
    .await?;

    let down = Instant::now();
    let (mut refused, mut others) = (0, 0);
    while down.elapsed() < Duration::from_secs(120) {
        let tick = Instant::now();
        let secret = format!("written-while-the-syncer-is-down-{refused}");
        let (ok, err) = kubectl(
            cluster,
            &mallory,
            &["-n", "default", "create", "secret", "generic", &secret],
        );
        assert!(
            !ok && err.contains("forbidden"),
            "the revoked kubeconfig was accepted {:?} after the syncer went down: {err}",
            down.elapsed()
        );
        refused += 1;
        if refused % 10 == 0 {
            let (ok, err) = kubectl(cluster, &dana, &["get", "namespaces"]);
            assert!(ok, "a live kubeconfig with the syncer down: {err}");
            let (ok, err) = kubectl(cluster, &glass, &["get", "clusterroles"]);
            assert!(ok, "break-glass with the syncer down: {err}");
            others += 1;
        }
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(tick.elapsed())).await;
    }
    println!(
        "syncer down {:?}: the revoked kubeconfig was refused {refused} times out of {refused}; \
         a live kubeconfig and break-glass answered {others} times each",
        down.elapsed()
    );
    assert!(refused >= 100, "{refused}");

    // The authorizer itself hung (its process stopped): failure policy Deny refuses every
    // request carrying a kubeconfig's serial group, live ones too, and break-glass, which never
    // reaches it, works. Resumed, the live kubeconfig works again.
    let pod = pods
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .find(|p| {
            p.metadata
                .name
                .as_deref()
                .unwrap_or("")
                .starts_with("kube-apiserver-")
        })
        .expect("the apiserver's pod");
    let pid = pod
        .status
        .and_then(|s| s.container_statuses)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.name == "vcp-authorizer")
        .and_then(|c| c.container_id)
        .and_then(|id| id.strip_prefix("devnode://").map(str::to_owned))
        .expect("the authorizer's process");
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    let hung = Instant::now();
    let (ok, err) = kubectl(cluster, &glass, &["get", "clusterroles"]);
    let glass_took = hung.elapsed();
    assert!(ok, "break-glass with the authorizer hung: {err}");
    // A request the apiserver has not answered in the last 10 s (its answer cache).
    let asked = Instant::now();
    let (ok, err) = kubectl(cluster, &dana, &["get", "namespace", "kube-public"]);
    let dana_took = asked.elapsed();
    signal("-CONT");
    // Refused: 500 naming the authorizer (the apiserver reports an authorizer's error when no
    // authorizer allows), never RBAC's answer alone.
    assert!(
        !ok && err.contains(vcp_core::revocation::WEBHOOK_PATH),
        "a vcp kubeconfig with the authorizer hung: {err}"
    );
    println!(
        "authorizer hung: break-glass answered in {glass_took:?}; a live kubeconfig was refused \
         after {dana_took:?}: {}",
        err.trim()
    );
    let resumed = Instant::now();
    testing::eventually(
        "the live kubeconfig works again",
        Duration::from_secs(60),
        || async {
            anyhow::Ok(
                kubectl(cluster, &dana, &["get", "namespaces"])
                    .0
                    .then_some(()),
            )
        },
    )
    .await?;
    println!(
        "authorizer resumed: the live kubeconfig works again after {:?}",
        resumed.elapsed()
    );
    Ok(())
}

/// The names of the sudo roles and bindings in the tenant (`vcp:sudo:*`), read with `admin`.
fn sudo_objects(cluster: &DevCluster, admin: &Path) -> Vec<String> {
    let (ok, out, err) = testing::kubectl_with(
        cluster,
        admin,
        &[
            "get",
            "clusterroles,clusterrolebindings",
            "-o",
            "jsonpath={range .items[*]}{.kind}/{.metadata.name} {end}",
        ],
    );
    assert!(ok, "{err}");
    out.split_whitespace()
        .filter(|n| n.contains("/vcp:sudo:"))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn sudo_dies_with_the_kubeconfig_that_granted_it() -> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let p = testing::platform(cluster, "vcp-sudo", 2).await?;
    let api = p.admin.clone();
    api.create_tenant("sudo").await?;
    api.wait_ready("sudo", Duration::from_secs(240)).await?;
    let dir = p.dir.path().to_owned();
    let issue = |user: &'static str, groups: &'static [&'static str], ttl: &'static str| {
        let (api, path) = (
            api.clone(),
            dir.join(format!("{user}-{}", groups.join("-"))),
        );
        async move {
            let kc = api.kubeconfig("sudo", user, groups, ttl).await?;
            std::fs::write(&path, kc)?;
            anyhow::Ok(path)
        }
    };
    let run = |kc: &Path, line: &str| {
        let args: Vec<&str> = line.split_whitespace().collect();
        testing::kubectl_with(cluster, kc, &args)
    };
    let may = |kc: &Path, line: &str| {
        let (ok, _, err) = run(kc, line);
        assert!(ok, "{} {line}: {err}", kc.display());
    };
    let may_not = |kc: &Path, line: &str| {
        let (ok, _, err) = run(kc, line);
        assert!(
            !ok && err.contains("forbidden"),
            "{} {line} must be forbidden: {err}",
            kc.display()
        );
    };
    let admin = issue("root", &["admin"], "2h").await?;

    // A sudoer, and a second kubeconfig of the same user without sudo: only the first sudoes.
    let sudo = issue("dave", &["view", "sudo"], "2h").await?;
    let dave_view = issue("dave", &["view"], "2h").await?;
    may(
        &sudo,
        "--as=dave --as-group=vcp:sudo create namespace by-sudo",
    );
    may_not(&sudo, "create namespace not-without-sudo");
    may_not(
        &dave_view,
        "--as=dave --as-group=vcp:sudo create namespace by-dave-view",
    );
    assert_eq!(sudo_objects(cluster, &admin).len(), 2);

    // The user is revoked, then issued view-only again under the same name: it has exactly
    // the groups of its new kubeconfig, whatever it asks to impersonate.
    let (status, body) = api
        .raw(Method::DELETE, "/v1/tenants/sudo/users/dave", None)
        .await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        sudo_objects(cluster, &admin),
        Vec::<String>::new(),
        "the revoked sudoer's role and binding are gone"
    );
    let again = issue("dave", &["view"], "2h").await?;
    may(&again, "get namespaces");
    may_not(
        &again,
        "--as=dave --as-group=vcp:sudo create namespace by-reissued",
    );
    may_not(&again, "--as=dave get namespaces");
    let (_, can, _) = run(&again, "auth can-i impersonate groups/vcp:sudo");
    assert_eq!(can.trim(), "no");

    // A revocation reconciles the tenant's sudo roles at once (a pass does it every few
    // minutes); one of a throwaway user triggers it.
    let mut throwaway = 0;
    let mut reconcile = || {
        throwaway += 1;
        let (api, user) = (api.clone(), format!("throwaway-{throwaway}"));
        async move {
            api.kubeconfig("sudo", &user, &["view"], "1h").await?;
            let (status, body) = api
                .raw(
                    Method::DELETE,
                    &format!("/v1/tenants/sudo/users/{user}"),
                    None,
                )
                .await?;
            anyhow::ensure!(status == 200, "{body}");
            anyhow::Ok(())
        }
    };

    // A sudo kubeconfig that expires: its role goes with the next reconcile, and the roles of
    // live sudoers stay.
    let _short = issue("erin", &["view", "sudo"], "15s").await?;
    let frank = issue("frank", &["edit", "sudo"], "2h").await?;
    assert_eq!(sudo_objects(cluster, &admin).len(), 4);
    tokio::time::sleep(Duration::from_secs(20)).await;
    reconcile().await?;
    let list = api
        .raw(Method::GET, "/v1/tenants/sudo/kubeconfigs", None)
        .await?
        .1;
    let frank_serial = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["user"] == "frank")
        .unwrap()["serial"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        sudo_objects(cluster, &admin),
        [
            format!("ClusterRole/vcp:sudo:{frank_serial}"),
            format!("ClusterRoleBinding/vcp:sudo:{frank_serial}")
        ]
    );
    may(
        &frank,
        "--as=frank --as-group=vcp:sudo create namespace by-frank",
    );

    // A role bound to a user name, as vcp wrote them before sudo was bound to serials, goes
    // with the next reconcile too.
    let legacy = issue("gina", &["view"], "2h").await?;
    let old = dir.join("legacy.yaml");
    std::fs::write(
        &old,
        r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: "vcp:sudo:0123456789abcdef0123"
  labels: {app.kubernetes.io/managed-by: vcp}
  annotations: {vcp.dev/sudo-user: gina}
rules:
- {apiGroups: [""], resources: [users], verbs: [impersonate], resourceNames: [gina]}
- {apiGroups: [""], resources: [groups], verbs: [impersonate], resourceNames: ["vcp:sudo"]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: "vcp:sudo:0123456789abcdef0123"
  labels: {app.kubernetes.io/managed-by: vcp}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "vcp:sudo:0123456789abcdef0123"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: gina}
"#,
    )?;
    may(&admin, &format!("apply -f {}", old.display()));
    may(
        &legacy,
        "--as=gina --as-group=vcp:sudo create namespace by-legacy",
    );
    reconcile().await?;
    may_not(
        &legacy,
        "--as=gina --as-group=vcp:sudo create namespace by-legacy-2",
    );
    assert_eq!(sudo_objects(cluster, &admin).len(), 2);
    Ok(())
}
