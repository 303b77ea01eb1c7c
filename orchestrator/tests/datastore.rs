//! Shared datastores on the dev cluster: two tenants whose plan keeps their data on one
//! three-member etcd run by vcp, each under its own prefix and etcd user. Each sees only its own
//! objects through its apiserver, and, below the apiservers, tenant A's etcd credentials are
//! refused every key of B's (and every key outside A's prefix), read with a real etcdctl, and so
//! are those its snapshot Jobs log in with (a password). A's snapshot is a logical one (its
//! keys only) and a restore from it brings back what was deleted after it, removes what was
//! created after it, and leaves B untouched. A third tenant moves from an etcd of its own to
//! the datastore and back by plan changes, keeping its objects, and each store it leaves is
//! emptied; then it grows from one etcd member to three by another while a client reads and
//! another writes. A deleted tenant's user and keys go; the other tenant keeps working.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use reqwest::Method;
use serde_json::{Value, json};
use std::path::Path;
use std::process::Output;
use std::time::Duration;
use vcp_dev::cluster::DevCluster;
use vcp_dev::platform::{
    ApiClient, HA_PROCESS_WORKLOADS_PLAN, PROCESS_WORKLOADS_PLAN, SHARED_PLAN,
};
use vcp_dev::testing::eventually;

const READY_TIMEOUT: Duration = Duration::from_secs(360);

async fn tenant_client(kubeconfig: &str) -> anyhow::Result<Client> {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(Client::try_from(cfg)?)
}

fn secret_file(s: &Secret, key: &str, dir: &Path, name: &str) -> anyhow::Result<String> {
    let bytes = &s
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .ok_or_else(|| anyhow::anyhow!("secret has no {key}"))?
        .0;
    let path = dir.join(name);
    std::fs::write(&path, bytes)?;
    Ok(path.to_string_lossy().into_owned())
}

/// etcdctl against one member with the client certificate of Secret `s` (and, for root, its
/// password).
struct Etcdctl {
    endpoint: String,
    tls: Vec<String>,
    user: Option<String>,
}

impl Etcdctl {
    fn new(endpoint: &str, s: &Secret, dir: &Path, who: &str) -> anyhow::Result<Etcdctl> {
        let dir = dir.join(who);
        std::fs::create_dir_all(&dir)?;
        let tls = vec![
            format!("--cacert={}", secret_file(s, "ca.crt", &dir, "ca.crt")?),
            format!("--cert={}", secret_file(s, "tls.crt", &dir, "tls.crt")?),
            format!("--key={}", secret_file(s, "tls.key", &dir, "tls.key")?),
        ];
        let user = s
            .data
            .as_ref()
            .and_then(|d| d.get("password"))
            .map(|p| format!("root:{}", String::from_utf8_lossy(&p.0)));
        Ok(Etcdctl {
            endpoint: endpoint.to_owned(),
            tls,
            user,
        })
    }

    /// The same connection, logged in as `user` with `password`.
    fn logged_in(mut self, user: &str, password: &str) -> Etcdctl {
        self.user = Some(format!("{user}:{password}"));
        self
    }

    fn run(&self, args: &[&str]) -> anyhow::Result<Output> {
        let mut cmd = std::process::Command::new(vcp_dev::bins::tool("etcdctl")?);
        cmd.arg(format!("--endpoints={}", self.endpoint))
            // The members' certificate names their DNS names, not the pod address dialled here;
            // what is under test is who etcd takes the client for.
            .arg("--insecure-skip-tls-verify")
            .arg("--command-timeout=10s")
            .args(&self.tls);
        if let Some(u) = &self.user {
            cmd.arg(format!("--user={u}"));
        }
        Ok(cmd.args(args).output()?)
    }

    fn ok(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self.run(args)?;
        anyhow::ensure!(
            out.status.success(),
            "etcdctl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn refused(&self, args: &[&str]) -> anyhow::Result<()> {
        let out = self.run(args)?;
        let err = String::from_utf8_lossy(&out.stderr);
        anyhow::ensure!(
            !out.status.success() && err.contains("permission denied"),
            "etcdctl {args:?} was not refused: status {}, stdout {:?}, stderr {err:?}",
            out.status,
            String::from_utf8_lossy(&out.stdout)
        );
        Ok(())
    }
}

#[tokio::test]
async fn tenants_on_a_shared_datastore_reach_only_their_own_keys() -> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let host = cluster.connect().await?;
    let p = vcp_dev::testing::platform(cluster, "vcp-datastore", 2).await?;
    let api = &p.admin;
    for name in ["ds-a", "ds-b"] {
        api.create_tenant_with_plan(name, SHARED_PLAN).await?;
    }
    // The one that moves between stores starts on an etcd of its own.
    api.create_tenant_with_plan("ds-m", PROCESS_WORKLOADS_PLAN)
        .await?;
    let mut keys = Vec::new();
    let mut clients = Vec::new();
    for name in ["ds-a", "ds-b"] {
        let t = api.wait_ready(name, READY_TIMEOUT).await?;
        keys.push(t["key"].as_str().unwrap().to_owned());
        let kc = api.kubeconfig(name, "alice", &["admin"], "1h").await?;
        clients.push(tenant_client(&kc).await?);
    }
    let (key_a, key_b) = (&keys[0], &keys[1]);

    // One datastore of three members; neither tenant has an etcd of its own.
    let ds = "vcp-datastore-shared";
    let sts = Api::<StatefulSet>::namespaced(host.clone(), ds)
        .get("etcd")
        .await?;
    assert_eq!(sts.status.and_then(|s| s.ready_replicas), Some(3));
    for key in &keys {
        let own = Api::<StatefulSet>::namespaced(host.clone(), &format!("vcp-{key}"))
            .get_opt("etcd")
            .await?;
        assert!(own.is_none(), "tenant {key} has an etcd of its own");
    }

    // Each tenant's objects are its own.
    let cms_a: Api<ConfigMap> = Api::namespaced(clients[0].clone(), "default");
    let cms_b: Api<ConfigMap> = Api::namespaced(clients[1].clone(), "default");
    let cm = |n: &str| -> anyhow::Result<ConfigMap> {
        Ok(serde_json::from_value(
            json!({"metadata": {"name": n}, "data": {"owner": n}}),
        )?)
    };
    cms_a.create(&PostParams::default(), &cm("only-a")?).await?;
    cms_b.create(&PostParams::default(), &cm("only-b")?).await?;
    assert!(cms_b.get_opt("only-a").await?.is_none());
    assert!(cms_a.get_opt("only-b").await?.is_none());

    // Below the apiservers: tenant A's own etcd credentials, as its apiserver holds them.
    let member = Api::<Pod>::namespaced(host.clone(), ds)
        .get("etcd-0")
        .await?
        .status
        .and_then(|s| s.pod_ip)
        .ok_or_else(|| anyhow::anyhow!("etcd-0 has no address"))?;
    let endpoint = format!("https://{member}:2379");
    let dir = tempfile::tempdir()?;
    let secret_of = |ns: String, name: &'static str| {
        let host = host.clone();
        async move { Api::<Secret>::namespaced(host, &ns).get(name).await }
    };
    let a_secret = secret_of(format!("vcp-{key_a}"), "apiserver-etcd-client").await?;
    let as_a = Etcdctl::new(&endpoint, &a_secret, dir.path(), "a")?;
    let own = as_a.ok(&[
        "get",
        &format!("/vcp/{key_a}/configmaps/default/only-a"),
        "--print-value-only",
    ])?;
    assert!(own.contains("only-a"), "A reads its own ConfigMap: {own:?}");
    as_a.refused(&["get", &format!("/vcp/{key_b}/"), "--prefix", "--keys-only"])?;
    as_a.refused(&["get", &format!("/vcp/{key_b}/configmaps/default/only-b")])?;
    as_a.refused(&["put", &format!("/vcp/{key_b}/configmaps/default/x"), "y"])?;
    as_a.refused(&["del", "/vcp/", "--prefix"])?;
    as_a.refused(&["get", "/registry/", "--prefix", "--keys-only"])?;
    // A key that only starts like A's is not A's.
    as_a.refused(&["put", &format!("/vcp/{key_a}x/evil"), "y"])?;

    // What A's snapshot Jobs log in with (a certificate naming no user, and A's password):
    // A's keys, and nothing of B's.
    let ns_a = format!("vcp-{key_a}");
    let jobs_cert = secret_of(ns_a.clone(), "datastore-client").await?;
    let user_secret = secret_of(ns_a.clone(), "datastore-user").await?;
    let field =
        |k: &str| String::from_utf8_lossy(&user_secret.data.as_ref().unwrap()[k].0).into_owned();
    assert_eq!(field("user"), format!("tenant-{key_a}"));
    let as_jobs = Etcdctl::new(&endpoint, &jobs_cert, dir.path(), "a-jobs")?
        .logged_in(&field("user"), &field("password"));
    let own = as_jobs.ok(&["get", &format!("/vcp/{key_a}/"), "--prefix", "--keys-only"])?;
    assert!(own.contains("only-a"), "{own}");
    as_jobs.refused(&["get", &format!("/vcp/{key_b}/"), "--prefix", "--keys-only"])?;
    as_jobs.refused(&["del", "/vcp/", "--prefix"])?;
    let wrong = Etcdctl::new(&endpoint, &jobs_cert, dir.path(), "a-wrong")?
        .logged_in(&field("user"), "not-the-password");
    let out = wrong.run(&["get", &format!("/vcp/{key_a}/"), "--prefix", "--keys-only"])?;
    assert!(!out.status.success(), "a wrong password reads nothing");

    // ds-m's moves and growth touch nothing of A's and B's: side by side with A's restore.
    let root = as_root_of(&host, &endpoint, dir.path()).await?;
    tokio::try_join!(
        logical_snapshot_and_restore(api, "ds-a", &cms_a, &cms_b),
        async {
            moves_between_stores(api, &host, "ds-m", &root).await?;
            grows_to_three_members(api, &host, "ds-m", dir.path(), &p.database_url).await
        },
    )?;

    // Deleting A takes its user and its keys; B goes on.
    api.delete_tenant("ds-a").await?;
    let root_secret = secret_of(ds.to_owned(), "etcd-root").await?;
    let as_root = Etcdctl::new(&endpoint, &root_secret, dir.path(), "root")?;
    eventually(
        "A's user and keys gone from the datastore",
        Duration::from_secs(240),
        || async {
            let users = as_root.ok(&["user", "list"])?;
            let left = as_root.ok(&[
                "get",
                &format!("/vcp/{key_a}/"),
                "--prefix",
                "--count-only",
                "--write-out=fields",
            ])?;
            let gone =
                !users.contains(&format!("tenant-{key_a}")) && left.contains("\"Count\" : 0");
            Ok(gone.then_some(()))
        },
    )
    .await?;
    let out = as_a.run(&["get", &format!("/vcp/{key_a}/"), "--prefix", "--keys-only"])?;
    assert!(
        !out.status.success(),
        "a deleted tenant's certificate reads nothing"
    );
    let b_keys = as_root.ok(&["get", &format!("/vcp/{key_b}/"), "--prefix", "--keys-only"])?;
    assert!(b_keys.contains("only-b"), "B's keys stay: {b_keys}");
    cms_b.create(&PostParams::default(), &cm("after")?).await?;
    let listed = Api::<Pod>::namespaced(host.clone(), ds)
        .list(&ListParams::default())
        .await?;
    println!(
        "datastore pods: {:?}",
        listed
            .items
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect::<Vec<_>>()
    );
    Ok(())
}

async fn as_root_of(host: &Client, endpoint: &str, dir: &Path) -> anyhow::Result<Etcdctl> {
    let root = Api::<Secret>::namespaced(host.clone(), "vcp-datastore-shared")
        .get("etcd-root")
        .await?;
    Etcdctl::new(endpoint, &root, dir, "root-moves")
}

/// Plan `to` for tenant `name` (a move, 202), then Ready on it again; the tenant as it is.
async fn move_to(api: &ApiClient, name: &str, to: &str) -> anyhow::Result<Value> {
    let started = std::time::Instant::now();
    let (s, t) = api
        .raw(
            Method::PATCH,
            &format!("/v1/tenants/{name}"),
            Some(&json!({"plan": to})),
        )
        .await?;
    assert_eq!(s, 202, "a plan change between stores is a move: {t}");
    assert_eq!(t["phase"], "Restoring", "{t}");
    let t = eventually(
        &format!("{name} moved to {to}"),
        Duration::from_secs(360),
        || async {
            let t = api.get_tenant(name).await?.unwrap();
            let l = api.snapshots(name).await?;
            if let Some(r) = l["restores"].as_array().and_then(|r| r.first()) {
                anyhow::ensure!(r["state"] != "Failed", "the move failed: {r}");
            }
            Ok((t["phase"] == "Ready" && t["plan"] == to).then_some(t))
        },
    )
    .await?;
    println!(
        "{name} moved to plan {to} in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(t)
}

/// A tenant on an etcd of its own moves to the shared datastore and back by plan changes,
/// keeping its objects; the etcd it left is gone, and so are its user and keys on the
/// datastore it left. What the API refuses first.
async fn moves_between_stores(
    api: &ApiClient,
    host: &Client,
    name: &str,
    root: &Etcdctl,
) -> anyhow::Result<()> {
    let t = api.wait_ready(name, READY_TIMEOUT).await?;
    let key = t["key"].as_str().unwrap().to_owned();
    let ns = format!("vcp-{key}");
    let kc = api.kubeconfig(name, "alice", &["admin"], "1h").await?;
    let cms: Api<ConfigMap> = Api::namespaced(tenant_client(&kc).await?, "default");
    let cm = |n: &str| -> anyhow::Result<ConfigMap> {
        Ok(serde_json::from_value(
            json!({"metadata": {"name": n}, "data": {"k": n}}),
        )?)
    };
    cms.create(&PostParams::default(), &cm("before-move")?)
        .await?;

    // Refused: an unknown plan, a plan with something else.
    for (body, status) in [
        (json!({"plan": "no-such-plan"}), 422),
        (
            json!({"plan": SHARED_PLAN, "fleet_upgrades": "exclude"}),
            422,
        ),
    ] {
        let (s, b) = api
            .raw(Method::PATCH, &format!("/v1/tenants/{name}"), Some(&body))
            .await?;
        assert_eq!(s, status, "{body}: {b}");
    }

    move_to(api, name, SHARED_PLAN).await?;
    let names = |l: kube::core::ObjectList<ConfigMap>| -> Vec<String> {
        l.items
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .collect()
    };
    let cms = Api::<ConfigMap>::namespaced(tenant_client(&kc).await?, "default");
    let on_shared = eventually(
        "the moved tenant serves",
        Duration::from_secs(60),
        || async { Ok(cms.list(&Default::default()).await.ok().map(names)) },
    )
    .await?;
    assert!(
        on_shared.contains(&"before-move".to_owned()),
        "{on_shared:?}"
    );
    let keys = root.ok(&["get", &format!("/vcp/{key}/"), "--prefix", "--keys-only"])?;
    assert!(
        keys.contains("before-move"),
        "its keys are on the datastore: {keys}"
    );
    let own = Api::<StatefulSet>::namespaced(host.clone(), &ns)
        .get_opt("etcd")
        .await?;
    assert!(own.is_none(), "the etcd it left is gone");
    let claims =
        Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(host.clone(), &ns)
            .list(&ListParams::default())
            .await?;
    assert!(
        claims.items.iter().all(|c| !c
            .metadata
            .name
            .as_deref()
            .unwrap_or("")
            .starts_with("data-etcd-")),
        "its members' volumes are gone"
    );
    cms.create(&PostParams::default(), &cm("on-shared")?)
        .await?;

    // And back to an etcd of its own.
    move_to(api, name, PROCESS_WORKLOADS_PLAN).await?;
    let cms = Api::<ConfigMap>::namespaced(tenant_client(&kc).await?, "default");
    let back = eventually(
        "the tenant serves from its own etcd",
        Duration::from_secs(60),
        || async { Ok(cms.list(&Default::default()).await.ok().map(names)) },
    )
    .await?;
    for n in ["before-move", "on-shared"] {
        assert!(back.contains(&n.to_owned()), "{n} lost: {back:?}");
    }
    eventually(
        "its user and keys gone from the datastore",
        Duration::from_secs(120),
        || async {
            let users = root.ok(&["user", "list"])?;
            let left = root.ok(&[
                "get",
                &format!("/vcp/{key}/"),
                "--prefix",
                "--count-only",
                "--write-out=fields",
            ])?;
            Ok(
                (!users.contains(&format!("tenant-{key}")) && left.contains("\"Count\" : 0"))
                    .then_some(()),
            )
        },
    )
    .await?;
    cms.create(&PostParams::default(), &cm("after-moves")?)
        .await?;
    Ok(())
}

/// Creates ConfigMap `w-<n>` every 250 ms until `stop`: the names written, and the writes
/// that failed (printed). A write whose connection closed before any answer is sent once more,
/// as a Go client would; `AlreadyExists` then means the first one landed.
fn writer(
    cms: Api<ConfigMap>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<(Vec<String>, u64)> {
    tokio::spawn(async move {
        let (mut written, mut failed) = (Vec::new(), 0);
        for n in 0.. {
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                break;
            }
            let name = format!("w-{n}");
            let cm: ConfigMap =
                serde_json::from_value(json!({"metadata": {"name": name}})).expect("a ConfigMap");
            let mut outcome = Err(String::new());
            for attempt in 0..2 {
                let sent = tokio::time::timeout(
                    Duration::from_secs(15),
                    cms.create(&PostParams::default(), &cm),
                )
                .await;
                outcome = match sent {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(kube::Error::Api(e))) if attempt > 0 && e.code == 409 => Ok(()),
                    Ok(Err(e @ kube::Error::Api(_))) => Err(e.to_string()),
                    Ok(Err(e)) => {
                        outcome = Err(e.to_string());
                        continue;
                    }
                    Err(_) => Err("no answer within 15 s".into()),
                };
                break;
            }
            match outcome {
                Ok(()) => written.push(name),
                Err(e) => {
                    eprintln!("writer: {name}: {e}");
                    failed += 1;
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        (written, failed)
    })
}

/// The tenant (on an etcd of its own, one member) changes to a plan with three: members are
/// added while a client reads and another writes, at most one of whose requests each fails
/// (in the members' last roll); its objects
/// stay, three members vote, and going back to one member is refused, as is a plan whose quota
/// its usage does not fit.
async fn grows_to_three_members(
    api: &ApiClient,
    host: &Client,
    name: &str,
    dir: &Path,
    database_url: &str,
) -> anyhow::Result<()> {
    use std::sync::{Arc, atomic::AtomicBool};
    let t = api.wait_ready(name, READY_TIMEOUT).await?;
    let ns = format!("vcp-{}", t["key"].as_str().unwrap());
    let kc = api.kubeconfig(name, "alice", &["admin"], "1h").await?;
    let cms: Api<ConfigMap> = Api::namespaced(tenant_client(&kc).await?, "default");
    let before = cms.list(&ListParams::default()).await?.items.len();
    let poller = vcp_dev::testing::Poller::start(cms.clone(), "before-move");
    let stop = Arc::new(AtomicBool::new(false));
    let writes = writer(cms.clone(), stop.clone());

    let started = std::time::Instant::now();
    let (s, b) = api
        .raw(
            Method::PATCH,
            &format!("/v1/tenants/{name}"),
            Some(&json!({"plan": HA_PROCESS_WORKLOADS_PLAN})),
        )
        .await?;
    assert_eq!(
        s, 200,
        "a plan with more etcd members is a change in place: {b}"
    );
    let sets: Api<StatefulSet> = Api::namespaced(host.clone(), &ns);
    let said = std::sync::Mutex::new(String::new());
    eventually(
        "three etcd members voting and the tenant Ready",
        Duration::from_secs(600),
        || {
            let (said, sets) = (&said, &sets);
            async move {
                let t = api
                    .get_tenant(name)
                    .await?
                    .ok_or_else(|| anyhow::anyhow!("{name} is gone"))?;
                let etcd = t["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|c| c["type"] == "EtcdReady")
                    .map(|c| format!("{} {}", c["reason"], c["message"]))
                    .unwrap_or_default();
                {
                    let mut last = said.lock().expect("not poisoned");
                    if etcd != *last {
                        println!(
                            "  {name} at {:.1}s: EtcdReady {etcd}",
                            started.elapsed().as_secs_f64()
                        );
                        *last = etcd;
                    }
                }
                let set = sets.get("etcd").await?;
                let voting = set
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("vcp.dev/etcd-members"))
                    .cloned();
                let status = set.status.unwrap_or_default();
                Ok((t["phase"] == "Ready"
                    && t["plan"] == HA_PROCESS_WORKLOADS_PLAN
                    && voting.as_deref() == Some("3")
                    && status.ready_replicas == Some(3)
                    && status.updated_replicas == Some(3))
                .then_some(()))
            }
        },
    )
    .await?;
    let grown = started.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (written, write_failures) = writes.await?;
    let (read, read_failures) = poller.finish().await?;
    println!(
        "{name} grew to three etcd members in {:.1}s; {} writes, {write_failures} failed; {} reads, {read_failures} failed",
        grown.as_secs_f64(),
        written.len() + write_failures as usize,
        read + read_failures
    );
    // The growth itself fails nothing; the members' last roll (docs/orchestrator.md, "Growing
    // a tenant's own etcd") can fail a request in flight to the member that stops: at most
    // one of each in our runs, each printed above.
    assert!(
        write_failures <= 1 && read_failures <= 1,
        "requests failed while members were added: {write_failures} writes, {read_failures} reads"
    );
    assert!(!written.is_empty() && read > 0);

    // Every object, the old and those written meanwhile.
    let now: std::collections::BTreeSet<String> = cms
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    assert_eq!(now.len(), before + written.len());
    for n in written.iter().chain(["before-move".to_owned()].iter()) {
        assert!(now.contains(n), "{n} lost");
    }

    // Three members, all voting, as etcd itself lists them.
    let member = Api::<Pod>::namespaced(host.clone(), &ns)
        .get("etcd-0")
        .await?
        .status
        .and_then(|s| s.pod_ip)
        .ok_or_else(|| anyhow::anyhow!("etcd-0 has no address"))?;
    let client = Api::<Secret>::namespaced(host.clone(), &ns)
        .get("apiserver-etcd-client")
        .await?;
    let etcdctl = Etcdctl::new(&format!("https://{member}:2379"), &client, dir, "grown")?;
    let list: Value =
        serde_json::from_str(&etcdctl.ok(&["member", "list", "--write-out=json"])?)?;
    let members = list["members"].as_array().cloned().unwrap_or_default();
    assert_eq!(members.len(), 3, "{list}");
    assert!(
        members
            .iter()
            .all(|m| m["isLearner"].as_bool() != Some(true)),
        "a learner left: {list}"
    );

    // Fewer members: refused, named.
    let (s, b) = api
        .raw(
            Method::PATCH,
            &format!("/v1/tenants/{name}"),
            Some(&json!({"plan": PROCESS_WORKLOADS_PLAN})),
        )
        .await?;
    assert_eq!(s, 409, "{b}");
    assert!(b.to_string().contains("removing members"), "{b}");

    // A plan whose quota the tenant's last usage sample does not fit: refused, each resource
    // named. The sample is written an hour ahead, so the sampler's own stay older.
    let db = sqlx::PgPool::connect(database_url).await?;
    sqlx::query(
        "INSERT INTO usage_samples (tenant_id, sampled_at, pods, requests_cpu, requests_memory,
             limits_cpu, limits_memory, services, persistent_volume_claims, requests_storage,
             namespaces)
         SELECT id, now() + interval '1 hour', 3, 0, 0, 0, 0, 0, 0, 0, 1
         FROM tenants WHERE name = $1 AND deleted_at IS NULL",
    )
    .bind(name)
    .execute(&db)
    .await?;
    let (s, b) = api
        .raw(
            Method::PATCH,
            &format!("/v1/tenants/{name}"),
            Some(&json!({"plan": "one-pod"})),
        )
        .await?;
    assert_eq!(s, 409, "{b}");
    assert!(
        b.to_string().contains("does not fit plan") && b.to_string().contains("pods 3 > 1"),
        "{b}"
    );
    let t = api
        .get_tenant(name)
        .await?
        .ok_or_else(|| anyhow::anyhow!("{name} is gone"))?;
    assert_eq!(
        t["plan"], HA_PROCESS_WORKLOADS_PLAN,
        "a refused change changes nothing"
    );
    Ok(())
}

/// A's snapshot holds A's keys only (a logical one); restoring it brings back what was deleted
/// after it and removes what was created after it, and B sees none of it.
async fn logical_snapshot_and_restore(
    api: &ApiClient,
    name: &str,
    cms_a: &Api<ConfigMap>,
    cms_b: &Api<ConfigMap>,
) -> anyhow::Result<()> {
    let cm = |n: &str| -> anyhow::Result<ConfigMap> {
        Ok(serde_json::from_value(
            json!({"metadata": {"name": n}, "data": {"k": n}}),
        )?)
    };
    cms_a
        .create(&PostParams::default(), &cm("deleted-after")?)
        .await?;
    let snap = api.take_snapshot(name, Duration::from_secs(240)).await?;
    let id = snap["id"].as_i64().unwrap();
    println!("logical snapshot: {snap}");
    assert_eq!(snap["kind"], "logical", "{snap}");
    let location = snap["location"].as_str().unwrap();
    assert!(
        location.ends_with(&format!("/snapshot-{id}.vcpl")),
        "{location}"
    );
    assert!(snap["size_bytes"].as_i64().unwrap() > 1000, "{snap}");

    cms_a
        .delete("deleted-after", &DeleteParams::default())
        .await?;
    cms_a
        .create(&PostParams::default(), &cm("created-after")?)
        .await?;
    cms_b
        .create(&PostParams::default(), &cm("b-during")?)
        .await?;

    let started = std::time::Instant::now();
    api.restore(name, id, Duration::from_secs(300)).await?;
    println!(
        "logical restore of snapshot {id} took {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let names = eventually(
        "A serves the restored objects",
        Duration::from_secs(60),
        || async {
            let Ok(l) = cms_a.list(&Default::default()).await else {
                return Ok(None);
            };
            Ok(Some(
                l.items
                    .into_iter()
                    .filter_map(|c| c.metadata.name)
                    .collect::<Vec<_>>(),
            ))
        },
    )
    .await?;
    assert!(
        names.contains(&"deleted-after".to_owned()) && names.contains(&"only-a".to_owned()),
        "{names:?}"
    );
    assert!(!names.contains(&"created-after".to_owned()), "{names:?}");
    // B: untouched, what it wrote during A's restore included.
    for n in ["only-b", "b-during"] {
        assert!(cms_b.get_opt(n).await?.is_some(), "B lost {n}");
    }
    // A works after it.
    cms_a
        .create(&PostParams::default(), &cm("after-restore")?)
        .await?;
    Ok(())
}
