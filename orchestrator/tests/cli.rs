//! The `vcp` client commands against a real `vcp serve` provisioning a real tenant: the
//! self-service flow of an owner (token, tenant with `--wait`, kubeconfigs for a teammate
//! and for itself, used with kubectl), the isolation between owners, and the output formats.

use serde_json::Value;
use std::path::Path;
use std::time::Duration;
use vcp_dev::cluster::DevCluster;

/// What one `vcp` invocation did.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn ok(self) -> Run {
        assert_eq!(self.code, 0, "{self:#?}");
        self
    }
    fn failed_with(self, status: &str) -> Run {
        assert_eq!(self.code, 1, "{self:#?}");
        assert!(
            self.stderr.starts_with("error: ") && self.stderr.contains(status),
            "{self:#?}"
        );
        self
    }
}

async fn vcp(url: &str, token: &str, args: &[&str]) -> anyhow::Result<Run> {
    let (code, stdout, stderr) =
        vcp_dev::testing::vcp_client(env!("CARGO_BIN_EXE_vcp"), url, token, 80, args).await?;
    Ok(Run {
        code,
        stdout,
        stderr,
    })
}

/// kubectl with a kubeconfig: (succeeded, stdout, stderr).
fn kubectl(cluster: &DevCluster, kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    vcp_dev::testing::kubectl_with(cluster, kubeconfig, args)
}

/// kubectl that must succeed; its stdout.
fn kubectl_ok(cluster: &DevCluster, kubeconfig: &Path, args: &[&str]) -> String {
    let (ok, out, err) = kubectl(cluster, kubeconfig, args);
    assert!(ok, "kubectl {args:?}: {err}");
    out
}

#[tokio::test]
async fn an_owner_provisions_a_tenant_and_issues_kubeconfigs_with_the_cli() -> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let p = vcp_dev::testing::platform(cluster, "vcp-cli", 2).await?;
    let (url, admin, dir) = (p.orchestrator.url.clone(), p.admin_token.clone(), &p.dir);

    // An admin creates two owner tokens; each secret is printed once, alone on stdout.
    let mut owners = Vec::new();
    for name in ["team-a", "team-b"] {
        let r = vcp(&url, &admin, &["token", "create", name, "--role", "owner"])
            .await?
            .ok();
        assert!(r.stderr.contains("shown this once"), "{r:#?}");
        let token = r.stdout.trim().to_owned();
        assert!(token.starts_with("vcp_") && !token.contains(' '), "{r:#?}");
        owners.push(token);
    }
    let (a, b) = (owners[0].as_str(), owners[1].as_str());
    let tokens = vcp(&url, &admin, &["token", "list", "-o", "json"])
        .await?
        .ok();
    let tokens: Value = serde_json::from_str(&tokens.stdout)?;
    assert!(
        !tokens.to_string().contains("vcp_"),
        "token listings never carry secrets"
    );

    // The owner creates a tenant and waits for it, with progress on stderr.
    let versions = vcp(&url, a, &["version", "list", "-o", "json"]).await?.ok();
    let versions: Value = serde_json::from_str(&versions.stdout)?;
    assert_eq!(versions["default"], "1.37");
    let r = vcp(
        &url,
        a,
        &[
            "tenant",
            "create",
            "shop",
            "--label",
            "team=a",
            "--wait",
            "--timeout",
            "5m",
        ],
    )
    .await?
    .ok();
    assert!(r.stderr.contains("waiting until Ready"), "{r:#?}");
    assert!(r.stderr.contains("shop is Provisioning"), "{r:#?}");
    assert!(r.stderr.contains("EtcdReady"), "{r:#?}");
    assert!(r.stderr.contains("shop is Ready"), "{r:#?}");
    let steps: Vec<&str> = r.stderr.lines().filter(|l| l.contains("] ")).collect();
    assert!(steps.len() >= 5, "one line per step: {r:#?}");
    assert!(r.stdout.contains("Ready"), "{r:#?}");

    // A `view` kubeconfig for a teammate and an `admin` one for the owner.
    let view = dir.path().join("bob.kubeconfig");
    let adm = dir.path().join("alice.kubeconfig");
    for (user, group, path) in [("bob", "view", &view), ("alice", "admin", &adm)] {
        let r = vcp(
            &url,
            a,
            &[
                "kubeconfig",
                "shop",
                "--user",
                user,
                "--group",
                group,
                "--ttl",
                "2h",
                "-o",
                path.to_str().unwrap(),
            ],
        )
        .await?
        .ok();
        assert!(r.stderr.contains(&format!("groups {group}")), "{r:#?}");
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(
            std::fs::metadata(path)?.permissions().mode() & 0o777,
            0o600,
            "a kubeconfig holds a private key"
        );
    }
    kubectl_ok(cluster, &view, &["get", "namespaces", "-o", "name"]);
    let (ok, _, err) = kubectl(cluster, &view, &["create", "namespace", "bobs"]);
    assert!(
        !ok && err.contains("forbidden"),
        "view cannot create: {err}"
    );
    kubectl_ok(cluster, &adm, &["create", "namespace", "shop"]);
    let deploy = [
        "-n",
        "shop",
        "create",
        "deployment",
        "web",
        "--image=nginx:1.29",
    ];
    kubectl_ok(cluster, &adm, &deploy);

    // Bootstrap bound the three access groups (and CoreDNS's reader) and nothing else.
    let bindings = kubectl_ok(
        cluster,
        &adm,
        &[
            "get",
            "clusterrolebindings",
            "-l",
            &format!("{}=vcp", vcp_orchestrator::render::LABEL_MANAGED_BY),
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.roleRef.name}/{.subjects[0].name} {end}",
        ],
    );
    assert_eq!(
        bindings.trim(),
        "vcp:admin=cluster-admin/admin vcp:coredns=vcp:coredns/vcp:coredns vcp:edit=edit/edit vcp:sudo=cluster-admin/vcp:sudo vcp:view=view/view"
    );

    // The four access levels, each by what it may and may not do: view (bob, above), edit
    // (erin), admin (alice, above) and sudo (dave: edit, and admin for one command by
    // impersonating himself into vcp:sudo).
    let edit = dir.path().join("erin.kubeconfig");
    let sudo = dir.path().join("dave.kubeconfig");
    for (user, groups, path) in [
        ("erin", &["edit"][..], &edit),
        ("dave", &["edit", "sudo"], &sudo),
    ] {
        let mut args = vec!["kubeconfig", "shop", "--user", user, "--ttl", "2h"];
        for g in groups {
            args.extend(["--group", g]);
        }
        args.extend(["-o", path.to_str().unwrap()]);
        vcp(&url, a, &args).await?.ok();
    }
    // Each check is one kubectl command line (no argument holds a space).
    let run =
        |kc: &Path, line: &str| kubectl(cluster, kc, &line.split_whitespace().collect::<Vec<_>>());
    let may = |kc: &Path, line: &str| {
        let (ok, _, err) = run(kc, line);
        assert!(ok, "{line}: {err}");
    };
    let may_not = |kc: &Path, line: &str| {
        let (ok, _, err) = run(kc, line);
        assert!(
            !ok && err.contains("forbidden"),
            "{line} must be forbidden: {err}"
        );
    };
    let binding = "create clusterrolebinding NAME --clusterrole=view --user=x";
    // view: reads, writes nothing.
    may(&view, "-n shop get deployments");
    may_not(&view, "-n shop create configmap by-bob");
    // edit: writes workloads, not RBAC or namespaces, and cannot impersonate.
    may(&edit, "-n shop create configmap by-erin");
    may_not(&edit, "create namespace erins");
    may_not(&edit, &binding.replace("NAME", "by-erin"));
    may_not(
        &edit,
        "--as=erin --as-group=vcp:sudo create namespace erins",
    );
    // admin: everything.
    may(&adm, &binding.replace("NAME", "by-alice"));
    // sudo: edit as himself ...
    may(&sudo, "-n shop create configmap by-dave");
    may(&sudo, "-n shop get configmaps");
    may_not(&sudo, "create namespace daves");
    // ... admin for one command as himself in vcp:sudo ...
    may(
        &sudo,
        "--as=dave --as-group=vcp:sudo create namespace daves",
    );
    may(
        &sudo,
        &format!(
            "--as=dave --as-group=vcp:sudo {}",
            binding.replace("NAME", "by-dave")
        ),
    );
    // ... and as nobody else, in no other group; a user who is not a sudoer cannot either.
    may_not(&sudo, "--as=alice --as-group=vcp:sudo get secrets -A");
    may_not(&sudo, "--as=dave --as-group=admin create namespace daves2");
    may_not(
        &sudo,
        "--as=dave --as-group=vcp:sudo --as-group=admin get secrets -A",
    );
    may_not(&view, "--as=bob --as-group=vcp:sudo create namespace bobs");

    // Lifetimes are capped by the server (168 hours by default); names that are not plain
    // printable text never reach the certificate or the inventory.
    let r = vcp(
        &url,
        a,
        &["kubeconfig", "shop", "--user", "carol", "--ttl", "400d"],
    )
    .await?
    .ok();
    let kc: serde_yaml::Value = serde_yaml::from_str(&r.stdout)?;
    assert_eq!(kc["users"][0]["name"], "carol", "{}", r.stdout.len());
    let (s, body) = p
        .admin
        .raw(
            reqwest::Method::POST,
            "/v1/tenants/shop/kubeconfigs",
            Some(&serde_json::json!({"user": "eve", "groups": ["a\u{0}b"]})),
        )
        .await?;
    assert_eq!((s, body["field"].as_str()), (422, Some("groups")), "{body}");

    // The inventory lists the kubeconfigs, never their keys.
    let r = vcp(&url, a, &["tenant", "kubeconfigs", "shop", "-o", "json"])
        .await?
        .ok();
    let issued: Value = serde_json::from_str(&r.stdout)?;
    let users: Vec<(&str, &str)> = issued["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["user"].as_str().unwrap(),
                k["groups"][0].as_str().unwrap_or("-"),
            )
        })
        .collect();
    assert_eq!(
        users[..4],
        [
            ("bob", "view"),
            ("alice", "admin"),
            ("erin", "edit"),
            ("dave", "edit")
        ]
    );
    assert_eq!(issued["items"][3]["groups"][1], "sudo");
    let carol = &issued["items"][4];
    assert_eq!(carol["user"], "carol");
    let expires = time::OffsetDateTime::parse(
        carol["expires_at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )?;
    let left = expires - time::OffsetDateTime::now_utc();
    assert!(
        // The cap (`--max-kubeconfig-ttl-hours`, 168 by default) and not the 400 days asked.
        left <= time::Duration::hours(168) && left > time::Duration::hours(167),
        "capped at 168 hours: {left}"
    );
    assert!(!r.stdout.contains("PRIVATE KEY"));
    let r = vcp(&url, a, &["tenant", "kubeconfigs", "shop"]).await?.ok();
    assert!(r.stdout.starts_with("USER"), "{r:#?}");

    // Output formats: JSON and YAML parse; the table fits 80 columns.
    let r = vcp(&url, a, &["tenant", "list", "-o", "json"]).await?.ok();
    let list: Value = serde_json::from_str(&r.stdout)?;
    assert_eq!(list["items"][0]["name"], "shop");
    assert_eq!(list["items"][0]["labels"]["team"], "a");
    let r = vcp(&url, a, &["tenant", "list", "-o", "yaml"]).await?.ok();
    let list: Value = serde_yaml::from_str(&r.stdout)?;
    assert_eq!(list["items"][0]["phase"], "Ready");
    for args in [
        &["tenant", "list"][..],
        &["tenant", "get", "shop"],
        &["tenant", "kubeconfigs", "shop"],
        &["tenant", "usage", "shop", "--since", "1h"],
        &["version", "list"],
    ] {
        let r = vcp(&url, a, args).await?.ok();
        for line in r.stdout.lines() {
            assert!(line.chars().count() <= 80, "{args:?}: {line:?}");
        }
    }
    let r = vcp(&url, a, &["tenant", "list"]).await?.ok();
    let mut lines = r.stdout.lines();
    assert!(lines.next().unwrap().starts_with("NAME"));
    assert!(lines.next().unwrap().starts_with("shop "), "{r:#?}");
    // Usage: the plan's limits under the samples (if vcp serve sampled already); a range
    // flag that is neither a time nor an age is refused before any request.
    let r = vcp(&url, a, &["tenant", "usage", "shop"]).await?.ok();
    assert!(r.stdout.starts_with("SAMPLED"), "{r:#?}");
    assert!(
        r.stdout.lines().last().unwrap().starts_with("limit "),
        "{r:#?}"
    );
    vcp(
        &url,
        a,
        &["tenant", "usage", "shop", "--since", "last week"],
    )
    .await?
    .failed_with("--since");

    // Owner B sees nothing of A's tenant; calling admin routes is forbidden.
    for args in [
        &["tenant", "get", "shop"][..],
        &["tenant", "delete", "shop"],
        &["tenant", "kubeconfigs", "shop"],
        &["tenant", "usage", "shop"],
        &[
            "kubeconfig",
            "shop",
            "--user",
            "mallory",
            "--group",
            "admin",
        ],
    ] {
        vcp(&url, b, args).await?.failed_with("HTTP 404");
    }
    let r = vcp(&url, b, &["tenant", "list", "-o", "json"]).await?.ok();
    assert_eq!(
        serde_json::from_str::<Value>(&r.stdout)?["items"],
        Value::Array(vec![])
    );
    vcp(&url, b, &["token", "create", "sneaky", "--role", "admin"])
        .await?
        .failed_with("HTTP 403");
    vcp(&url, b, &["token", "list"])
        .await?
        .failed_with("HTTP 403");

    // Revoked and unknown tokens get 401; bad input is refused with the field at fault.
    vcp(&url, &admin, &["token", "revoke", "team-b"])
        .await?
        .ok();
    vcp(&url, b, &["tenant", "list"])
        .await?
        .failed_with("HTTP 401");
    vcp(&url, "vcp_unknown", &["tenant", "list"])
        .await?
        .failed_with("HTTP 401");
    vcp(&url, a, &["tenant", "create", "Bad_Name"])
        .await?
        .failed_with("field name");
    vcp(
        &url,
        a,
        &["tenant", "create", "other", "--kubernetes-version", "1.12"],
    )
    .await?
    .failed_with("field version");
    vcp(&url, a, &["tenant", "create", "shop"])
        .await?
        .failed_with("HTTP 409");
    vcp(
        &url,
        a,
        &[
            "kubeconfig",
            "shop",
            "--user",
            "system:admin",
            "--group",
            "x",
        ],
    )
    .await?
    .failed_with("field user");
    vcp("http://127.0.0.1:1", a, &["tenant", "list"])
        .await?
        .failed_with("cannot reach");
    vcp(&url, "", &["tenant", "list"])
        .await?
        .failed_with("no token");
    // Flags work after the subcommand too, and override the environment.
    vcp(&url, "vcp_unknown", &["tenant", "list", "--token", a])
        .await?
        .ok();

    // Deletion with --wait returns once the tenant is gone.
    let r = vcp(&url, a, &["tenant", "get", "shop", "-o", "json"])
        .await?
        .ok();
    let key = serde_json::from_str::<Value>(&r.stdout)?["key"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = vcp(
        &url,
        a,
        &["tenant", "delete", "shop", "--wait", "--timeout", "4m"],
    )
    .await?
    .ok();
    assert!(r.stdout.contains("tenant shop deleted"), "{r:#?}");
    assert!(r.stderr.contains("shop is Deleting"), "{r:#?}");
    let r = vcp(&url, a, &["tenant", "list", "-o", "json"]).await?.ok();
    assert_eq!(
        serde_json::from_str::<Value>(&r.stdout)?["items"],
        Value::Array(vec![])
    );
    vcp_dev::testing::eventually(
        "no host namespace of shop left",
        Duration::from_secs(60),
        || async {
            let host = cluster.connect().await?;
            let ns = vcp_dev::testing::tenant_namespaces(&host, &key).await?;
            Ok(ns.is_empty().then_some(()))
        },
    )
    .await?;
    Ok(())
}

/// The first line of a table `out` whose cells include every one of `cells`.
fn row<'a>(out: &'a str, cells: &[&str]) -> Option<&'a str> {
    out.lines().find(|l| {
        let have: Vec<&str> = l.split_whitespace().collect();
        cells.iter().all(|c| have.contains(c))
    })
}

/// A `--maintenance-window` that is closed now and for the next two days.
fn closed_window() -> String {
    let day = (time::OffsetDateTime::now_utc() + time::Duration::days(3)).weekday();
    format!("{} 00:00 1h", &day.to_string()[..3].to_lowercase())
}

/// The admin's commands over one tenant, in the order a day of operations might run them:
/// snapshots (create, list, restore), a fleet upgrade held by a maintenance window and
/// paused, resumed and cancelled, then the tenant's own upgrade, followed to its end.
#[tokio::test]
async fn an_admin_snapshots_restores_and_upgrades_a_tenant_and_steers_fleet_upgrades_with_the_cli()
-> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let p = vcp_dev::testing::platform(cluster, "vcp-cli-ops", 2).await?;
    let (url, admin, dir) = (p.orchestrator.url.clone(), p.admin_token.clone(), &p.dir);
    let name = "ops";
    let run = |args: &'static [&'static str]| vcp(&url, &admin, args);
    vcp(
        &url,
        &admin,
        &[
            "tenant",
            "create",
            name,
            "--kubernetes-version",
            "1.36",
            "--wait",
            "--timeout",
            "5m",
        ],
    )
    .await?
    .ok();
    let kc = dir.path().join("ops.kubeconfig");
    vcp(
        &url,
        &admin,
        &[
            "kubeconfig",
            name,
            "--user",
            "alice",
            "--group",
            "admin",
            "-o",
            kc.to_str().unwrap(),
        ],
    )
    .await?
    .ok();
    kubectl_ok(
        cluster,
        &kc,
        &["create", "configmap", "kept", "--from-literal=k=v"],
    );

    // A snapshot, waited for: printed once taken.
    let r = run(&["snapshot", "create", "ops", "--wait", "-o", "json"])
        .await?
        .ok();
    let snap: Value = serde_json::from_str(&r.stdout)?;
    assert_eq!(
        (snap["state"].as_str(), snap["version"].as_str()),
        (Some("Succeeded"), Some("1.36")),
        "{r:#?}"
    );
    let id = snap["id"].as_i64().unwrap().to_string();
    let r = run(&["snapshot", "list", "ops"]).await?.ok();
    assert!(r.stdout.starts_with("ID"), "{r:#?}");
    assert!(
        row(&r.stdout, &[&id, "Succeeded", "1.36"]).is_some(),
        "{r:#?}"
    );

    // What is deleted after the snapshot is back after the restore.
    kubectl_ok(cluster, &kc, &["delete", "configmap", "kept"]);
    let r = vcp(
        &url,
        &admin,
        &[
            "snapshot",
            "restore",
            "ops",
            "--snapshot",
            &id,
            "--wait",
            "--timeout",
            "5m",
        ],
    )
    .await?
    .ok();
    assert!(row(&r.stdout, &[&id, "Succeeded"]).is_some(), "{r:#?}");
    let kept =
        vcp_dev::testing::eventually("the restored apiserver", Duration::from_secs(60), || {
            let (ok, out, _) = kubectl(
                cluster,
                &kc,
                &["get", "configmap", "kept", "-o", "jsonpath={.data.k}"],
            );
            async move { Ok(ok.then_some(out)) }
        })
        .await?;
    assert_eq!(kept, "v");
    let r = run(&["snapshot", "list", "ops", "-o", "json"]).await?.ok();
    let listed: Value = serde_json::from_str(&r.stdout)?;
    assert_eq!(listed["restores"][0]["state"], "Succeeded", "{r:#?}");

    // A fleet upgrade that must wait for the tenant's window: paused, resumed, cancelled;
    // the tenant never moves.
    let window = closed_window();
    vcp(
        &url,
        &admin,
        &["tenant", "update", "ops", "--maintenance-window", &window],
    )
    .await?
    .ok();
    let r = run(&[
        "upgrade",
        "create",
        "--to",
        "1.37",
        "--names",
        "ops",
        "--soak-seconds",
        "0",
        "-o",
        "json",
    ])
    .await?
    .ok();
    let fleet: Value = serde_json::from_str(&r.stdout)?;
    assert_eq!(fleet["state"], "Running", "{r:#?}");
    let fid = fleet["id"].as_i64().unwrap().to_string();
    let act = |action: &'static str, extra: &'static [&'static str]| {
        let mut args = vec!["upgrade", action, fid.as_str()];
        args.extend(extra);
        let (url, admin) = (url.clone(), admin.clone());
        async move { vcp(&url, &admin, &args).await }
    };
    let r = act("pause", &["--reason", "change freeze", "-o", "json"])
        .await?
        .ok();
    let d: Value = serde_json::from_str(&r.stdout)?;
    assert_eq!(d["state"], "Paused", "{r:#?}");
    let r = act("resume", &[]).await?.ok();
    assert!(
        r.stdout
            .starts_with(&format!("fleet upgrade {fid} to 1.37")),
        "{r:#?}"
    );
    assert!(r.stdout.contains("Running wave 1/1"), "{r:#?}");
    // The planner looks again after the resume, holds the tenant for its window and says so
    // (a tenant it started instead would leave Pending, and never carry that reason).
    let held = vcp_dev::testing::eventually(
        "the fleet upgrade holding ops for its window",
        Duration::from_secs(30),
        || async {
            let r = act("get", &[]).await?.ok();
            Ok(row(&r.stdout, &["ops", "1.36", "->", "1.37"]).map(str::to_owned))
                .map(|l| l.filter(|l| l.contains("waits for its maintenance window")))
        },
    )
    .await?;
    assert!(held.contains("Pending"), "{held}");
    let r = act("cancel", &["--reason", "not this week"]).await?.ok();
    assert!(r.stdout.contains("Cancelled"), "{r:#?}");
    let skipped = row(&r.stdout, &["ops", "Skipped"]).unwrap_or_else(|| panic!("{r:#?}"));
    assert!(skipped.contains("not this week"), "{r:#?}");
    act("resume", &[]).await?.failed_with("HTTP 409");
    act("cancel", &[]).await?.failed_with("HTTP 409");
    let r = run(&["tenant", "get", "ops", "-o", "json"]).await?.ok();
    let t: Value = serde_json::from_str(&r.stdout)?;
    assert_eq!(
        (t["version"].as_str(), t["phase"].as_str()),
        (Some("1.36"), Some("Ready")),
        "{r:#?}"
    );

    // The tenant's own upgrade, followed until it ends.
    let r = run(&[
        "tenant",
        "upgrade",
        "ops",
        "--to",
        "1.37",
        "--wait",
        "--timeout",
        "5m",
    ])
    .await?
    .ok();
    assert!(
        r.stderr
            .contains("tenant ops upgrading to 1.37; waiting until done"),
        "{r:#?}"
    );
    // The listing shows the release the tenant runs now.
    let listed = row(&r.stdout, &["ops", "Ready"]).unwrap_or_else(|| panic!("{r:#?}"));
    assert!(listed.contains(" v1.37."), "{r:#?}");
    let r = run(&["tenant", "get", "ops", "-o", "json"]).await?.ok();
    let t: Value = serde_json::from_str(&r.stdout)?;
    assert_eq!(t["upgrade"]["state"], "Succeeded", "{r:#?}");
    // A finished tenant upgrade cannot be asked for again to the same minor.
    run(&["tenant", "upgrade", "ops", "--to", "1.37"])
        .await?
        .failed_with("HTTP 422");
    Ok(())
}
