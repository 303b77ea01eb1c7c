//! Helpers shared by the integration tests of every crate (test-support code, so it speaks
//! `anyhow` like the tests that call it).

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Client;
use kube::api::{Api, PostParams};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What one `vcp` client command (`program`, the test crate's `CARGO_BIN_EXE_vcp`) did
/// against the API at `url` with `token`, `columns` wide: (exit code, stdout, stderr).
pub async fn vcp_client(
    program: &str,
    url: &str,
    token: &str,
    columns: u16,
    args: &[&str],
) -> anyhow::Result<(i32, String, String)> {
    let out = tokio::process::Command::new(program)
        .args(args)
        .env("VCP_API_URL", url)
        .env("VCP_TOKEN", token)
        .env("COLUMNS", columns.to_string())
        .env_remove("RUST_LOG")
        .env_remove("VCP_OWNER")
        .output()
        .await?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout)?,
        String::from_utf8(out.stderr)?,
    ))
}

/// kubectl of `cluster`'s version with `kubeconfig`: (succeeded, stdout, stderr).
pub fn kubectl_with(
    cluster: &crate::cluster::DevCluster,
    kubeconfig: &std::path::Path,
    args: &[&str],
) -> (bool, String, String) {
    let out = std::process::Command::new(cluster.kubectl())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .expect("kubectl runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// One HTTP request from inside pod `ns/pod` (by `kubectl exec` with `kubeconfig`: the host's,
/// or a tenant's) to `target` (`host:port`), with busybox's `nc` (its `wget` crashes in the
/// static build). Whether a 200 came back.
pub fn http_get_from_pod(
    cluster: &crate::cluster::DevCluster,
    kubeconfig: &std::path::Path,
    ns: &str,
    pod: &str,
    target: &str,
) -> bool {
    let (host, port) = target.rsplit_once(':').expect("host:port");
    let (_, out, _) = kubectl_with(
        cluster,
        kubeconfig,
        &[
            "-n",
            ns,
            "exec",
            pod,
            "--",
            "sh",
            "-c",
            &format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | timeout 5 nc -w 2 {host} {port}"),
        ],
    );
    out.contains("200 OK")
}

/// The first event about object `name` with `reason` whose message contains `text`, within a
/// minute.
pub async fn event_about(
    events: &Api<k8s_openapi::api::core::v1::Event>,
    name: &str,
    reason: &str,
    text: &str,
) -> anyhow::Result<k8s_openapi::api::core::v1::Event> {
    eventually(
        &format!("a {reason} event about {name} saying {text:?}"),
        Duration::from_secs(60),
        || async {
            let list = events.list(&Default::default()).await?;
            Ok(list.items.into_iter().find(|e| {
                e.involved_object.name.as_deref() == Some(name)
                    && e.reason.as_deref() == Some(reason)
                    && e.message.as_deref().is_some_and(|m| m.contains(text))
            }))
        },
    )
    .await
}

/// Polls `f` every 250 ms until it yields a value; fails after `timeout`, naming `what`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await? {
            return Ok(v);
        }
        anyhow::ensure!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Creates a namespace and waits for its default service account.
pub async fn namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    // Until pods may be created in it: admission refuses a pod whose service account the
    // controller-manager has not made yet, which under load takes seconds.
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client.clone(), name);
    eventually(
        &format!("the default service account of namespace {name}"),
        Duration::from_secs(60),
        || async { Ok(sas.get_opt("default").await?) },
    )
    .await?;
    Ok(())
}

/// A tenant policy (`TenantControlPlane::policy_flag`) that places the tenant's pods on the
/// devnode, where they run as real processes with real addresses.
pub const DEVNODE_PLACEMENT: &str = "placement:\n  node_selector: {vcp.dev/runtime: process}\n  tolerations: [{key: vcp.dev/runtime, operator: Exists}]\n";

/// A tenant policy that places the tenant's pods on the real node (`Options::real_node`), where
/// they run as containers.
pub const REAL_NODE_PLACEMENT: &str = "placement:\n  node_selector: {vcp.dev/node: real}\n  tolerations: [{key: vcp.dev/node, operator: Exists}]\n";

/// A dev cluster of its own with one kwok worker and the real node, in a temporary state dir.
/// Bind it as `let (_dir, cluster) = ...`: locals drop in reverse order, so the cluster stops
/// (and sweeps its node's network, recorded in that dir) before the dir goes.
pub async fn real_node_cluster() -> anyhow::Result<(tempfile::TempDir, crate::cluster::DevCluster)>
{
    let dir = tempfile::tempdir()?;
    let cluster = crate::cluster::DevCluster::start_with(crate::cluster::Options {
        state_dir: dir.path().to_owned(),
        workers: 1,
        supervision: crate::process::Supervision::Attached,
        real_node: true,
    })
    .await?;
    Ok((dir, cluster))
}

/// Whether a pod's phase is Running.
pub fn running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Pod `p`'s condition of type `type_`, if it has one.
pub fn condition<'a>(
    p: &'a Pod,
    type_: &str,
) -> Option<&'a k8s_openapi::api::core::v1::PodCondition> {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
}

/// Host namespaces of tenant `key`: its control plane (`vcp-<key>`) and every namespace the
/// syncer translated (`<key>-<ns>`).
pub async fn tenant_namespaces(host: &Client, key: &str) -> anyhow::Result<Vec<String>> {
    Ok(Api::<Namespace>::all(host.clone())
        .list(&kube::api::ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .filter(|n| n.starts_with(&format!("{key}-")) || *n == format!("vcp-{key}"))
        .collect())
}

/// Writes the repository's `templates/` into `dir`, with the versions catalog
/// (`versions.yaml`) changed by `edit`: for a `vcp serve` whose catalog differs from the
/// built-in one (`VCP_TEMPLATES`), say with a minor expired or a flag that breaks it.
pub fn templates_with(dir: &std::path::Path, edit: impl Fn(&str) -> String) -> anyhow::Result<()> {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../templates");
    std::fs::create_dir_all(dir)?;
    for f in std::fs::read_dir(&src)? {
        let f = f?;
        let text = std::fs::read_to_string(f.path())?;
        let text = if f.file_name() == "versions.yaml" {
            edit(&text)
        } else {
            text
        };
        std::fs::write(dir.join(f.file_name()), text)?;
    }
    Ok(())
}

/// Starts `vcp serve` as replica `replica` over database `db` (which several replicas may
/// share), with two reconcile workers, its files and log in `dir`: for tests that run more
/// than one replica, or restart one, over one inventory.
pub async fn replica(
    cluster: &crate::cluster::DevCluster,
    dir: &std::path::Path,
    db: &str,
    token: &str,
    replica: &str,
) -> anyhow::Result<crate::platform::Orchestrator> {
    Ok(crate::platform::start_orchestrator(
        cluster,
        dir,
        &crate::platform::ServeOptions {
            database_url: db.to_owned(),
            admin_token: token.to_owned(),
            replica_id: replica.to_owned(),
            workers: 2,
            port: None,
            simulate: false,
            extra_env: vec![],
            backup_prefix: None,
        },
        crate::process::Supervision::Attached,
    )
    .await?)
}

/// A `vcp serve` of one test: its own Postgres, database and directory, gone with it.
pub struct TestPlatform {
    // Fields drop in order: the server stops before its database.
    pub orchestrator: crate::platform::Orchestrator,
    pub admin_token: String,
    /// A client with the admin token.
    pub admin: crate::platform::ApiClient,
    /// Its inventory, for tests that act as another replica would.
    pub database_url: String,
    pub dir: tempfile::TempDir,
    _postgres: crate::postgres::EphemeralPostgres,
}

/// Starts `vcp serve` on `cluster` as replica `name` with `workers` reconcile workers (0: the
/// API alone, nothing is provisioned).
pub async fn platform(
    cluster: &crate::cluster::DevCluster,
    name: &str,
    workers: u16,
) -> anyhow::Result<TestPlatform> {
    platform_with(cluster, name, workers, Vec::new()).await
}

/// [`platform`] with more `VCP_*` settings for `vcp serve` (see `ServeOptions::extra_env`).
pub async fn platform_with(
    cluster: &crate::cluster::DevCluster,
    name: &str,
    workers: u16,
    extra_env: Vec<(String, String)>,
) -> anyhow::Result<TestPlatform> {
    platform_of(cluster, name, workers, extra_env, None).await
}

/// [`platform_with`] uploading snapshots to the cluster's S3 server under prefix `name`.
pub async fn platform_with_backups(
    cluster: &crate::cluster::DevCluster,
    name: &str,
    workers: u16,
    extra_env: Vec<(String, String)>,
) -> anyhow::Result<TestPlatform> {
    platform_of(cluster, name, workers, extra_env, Some(name.to_owned())).await
}

async fn platform_of(
    cluster: &crate::cluster::DevCluster,
    name: &str,
    workers: u16,
    extra_env: Vec<(String, String)>,
    backup_prefix: Option<String>,
) -> anyhow::Result<TestPlatform> {
    use crate::platform::{self, ServeOptions};
    let postgres = crate::postgres::EphemeralPostgres::start().await?;
    let dir = tempfile::tempdir()?;
    let admin_token = platform::new_token();
    let database_url = postgres.create_database(&name.replace('-', "_")).await?;
    let orchestrator = platform::start_orchestrator(
        cluster,
        dir.path(),
        &ServeOptions {
            database_url: database_url.clone(),
            admin_token: admin_token.clone(),
            replica_id: name.to_owned(),
            workers,
            port: None,
            simulate: false,
            extra_env,
            backup_prefix,
        },
        crate::process::Supervision::Attached,
    )
    .await?;
    Ok(TestPlatform {
        admin: platform::ApiClient::new(&orchestrator.url, &admin_token),
        orchestrator,
        admin_token,
        database_url,
        dir,
        _postgres: postgres,
    })
}

/// A client asking an apiserver for one object (a ConfigMap; a Secret, whose reads need its
/// decryption) every 200 ms until stopped, as a user would through an upgrade or a rollout;
/// counts answered and failed requests, and prints why each failed.
pub struct Poller {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Poller {
    /// Starts polling ConfigMap `name` of `cms`.
    pub fn start(cms: Api<k8s_openapi::api::core::v1::ConfigMap>, name: &str) -> Poller {
        Poller::start_for(cms, name)
    }

    /// Starts polling object `name` of `cms`, of any kind (a Secret: its reads decrypt it).
    pub fn start_for<K>(cms: Api<K>, name: &str) -> Poller
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    {
        let name = name.to_owned();
        let stop = Arc::new(AtomicBool::new(false));
        let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let task = {
            let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    // kubectl's own timeout is 32 s: a slower answer on a loaded machine is
                    // still an answer, a refusal or a reset is not. One immediate retry, as Go
                    // clients (kubectl) make for an idempotent request whose kept-alive
                    // connection closed under it before any answer: kube-rs does not. A request
                    // that was never sent (hyper's `SendRequest`: the pooled connection was
                    // already closed) is tried once more beyond that, as Go's transport tries
                    // an unwritten request again on another connection: a pool can hold two
                    // connections the same terminating apiserver closed (CI, 2026-11-30: both
                    // attempts met one, in an encryption-key rotation's first roll).
                    let mut last = String::new();
                    let mut answered = false;
                    let mut attempts = 2;
                    let mut attempt = 0;
                    while attempt < attempts {
                        attempt += 1;
                        match tokio::time::timeout(Duration::from_secs(15), cms.get(&name)).await {
                            Ok(Ok(_)) => {
                                answered = true;
                                break;
                            }
                            // An answer, even an error status, is the server's word: no retry.
                            Ok(Err(e @ kube::Error::Api(_))) => {
                                last = format!("request failed: {e}");
                                break;
                            }
                            Ok(Err(e)) => {
                                last = format!("request failed: {e}");
                                if last.contains("SendRequest") {
                                    attempts = 3;
                                }
                            }
                            Err(_) => {
                                last = "no answer within 15 s".into();
                                break;
                            }
                        }
                    }
                    if answered {
                        ok.fetch_add(1, Ordering::Relaxed);
                    } else {
                        eprintln!("poller: {last}");
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            })
        };
        Poller {
            stop,
            ok,
            failed,
            task,
        }
    }

    /// Stops; (answered, failed).
    pub async fn finish(self) -> anyhow::Result<(u64, u64)> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await?;
        Ok((
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        ))
    }
}

/// Reads a pod's default gateway from `/proc/net/route`, in Python: the node address a pod on
/// the devnode sees (the host side of its bridge), where the devnode serves NodePorts to pods
/// as kube-proxy serves them on every node address.
pub const PY_DEFAULT_GATEWAY: &str = r#"
def default_gateway():
    import socket
    with open("/proc/net/route") as f:
        for line in f.readlines()[1:]:
            iface, dest, gw, flags = line.split()[:4]
            if dest == "00000000" and int(flags, 16) & 2:
                return socket.inet_ntoa(int(gw, 16).to_bytes(4, "little"))
    raise RuntimeError("no default route")
"#;

/// The token poller's script: every 200 ms it reads the pod's service-account token and CA
/// afresh (both change on rotation; the CA may be a bundle of several certificates, which
/// `cafile=` takes as concatenated PEM), calls the tenant apiserver through the NodePort
/// (`NODE_PORT`) on the pod's node address, verifying the serving certificate as
/// `kubernetes.default.svc`, and POSTs a SelfSubjectReview with the token. One line per call:
/// `ok answered=<n> failed=<n> user=<name>` or `failed answered=<n> failed=<n> <reason>`;
/// the counters are cumulative, so the last line alone has the totals.
const TOKEN_POLLER_PY: &str = r#"
import http.client, json, os, socket, ssl, sys, time
SA = "/var/run/secrets/kubernetes.io/serviceaccount"
PORT = int(os.environ["NODE_PORT"])
NAME = "kubernetes.default.svc"
PATH = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
BODY = json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})

def call(gw):
    with open(SA + "/token") as f:
        token = f.read().strip()
    ctx = ssl.create_default_context(cafile=SA + "/ca.crt")
    conn = http.client.HTTPSConnection(gw, PORT, timeout=10)
    try:
        raw = socket.create_connection((gw, PORT), timeout=10)
        try:
            conn.sock = ctx.wrap_socket(raw, server_hostname=NAME)
        except ssl.SSLError as e:
            raw.close()
            return None, "TLS error: %s" % e
        conn.request("POST", PATH, BODY, {"Authorization": "Bearer " + token,
                                          "Content-Type": "application/json"})
        r = conn.getresponse()
        text = r.read().decode("utf-8", "replace")
        if r.status == 201:
            return json.loads(text)["status"]["userInfo"]["username"], None
        return None, "HTTP %d: %s" % (r.status, " ".join(text.split())[:300])
    finally:
        conn.close()

answered = failed = 0
gw = default_gateway()
print("token-poller: calling %s:%d as %s" % (gw, PORT, NAME), flush=True)
while True:
    t0 = time.monotonic()
    try:
        user, why = call(gw)
    except Exception as e:
        user, why = None, "%s: %s" % (type(e).__name__, e)
    if why is None:
        answered += 1
        print("ok answered=%d failed=%d user=%s" % (answered, failed, user), flush=True)
    else:
        failed += 1
        print("failed answered=%d failed=%d %s" % (answered, failed, why), flush=True)
    time.sleep(max(0.0, 0.2 - (time.monotonic() - t0)))
"#;

/// What a [`TokenPoller`] saw so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenCounts {
    /// Calls the tenant apiserver answered for the token (201 with a user).
    pub answered: u64,
    pub failed: u64,
    /// One line per failed call, with its reason (TLS error, HTTP status and body excerpt).
    pub failures: Vec<String>,
}

impl TokenCounts {
    /// The counts in a poller's log (pure): the last result line's totals, and every failure.
    pub fn from_log(log: &str) -> TokenCounts {
        let mut counts = TokenCounts::default();
        let mut previous = "";
        for line in log.lines() {
            let before = std::mem::replace(&mut previous, line);
            let mut words = line.splitn(4, ' ');
            let (Some(verdict), Some(a), Some(f)) = (words.next(), words.next(), words.next())
            else {
                continue;
            };
            let (Some(a), Some(f)) = (
                a.strip_prefix("answered=").and_then(|n| n.parse().ok()),
                f.strip_prefix("failed=").and_then(|n| n.parse().ok()),
            ) else {
                continue;
            };
            match verdict {
                // A count that grew without its failure line (a line the log lost, or one
                // that printed otherwise): the lines around it are all there is to go on.
                "ok" if f > counts.failed && counts.failures.len() < f as usize => {
                    counts.failures.push(format!(
                        "(no failure line) before: {before:?}; after: {line:?}"
                    ))
                }
                "ok" => {}
                "failed" => counts.failures.push(line.to_owned()),
                _ => continue,
            }
            (counts.answered, counts.failed) = (a, f);
        }
        counts
    }
}

/// A tenant pod on the devnode that calls its tenant apiserver with its own service-account
/// token every 200 ms (a SelfSubjectReview, which any authenticated user may make), over TLS
/// verified against its mounted `ca.crt`, reading both files afresh each time: what a workload
/// sees of a CA or service-account key rotation. The pod reaches the apiserver's NodePort on
/// its node address (its default gateway), as a pod would through kube-proxy; the tenant must
/// place its pods on the devnode (plan [`crate::platform::PROCESS_WORKLOADS_PLAN`]).
///
/// The counts live in the pod's log, read through the tenant apiserver, so the test process
/// keeps no state the pod does not: they survive anything but the pod itself.
pub struct TokenPoller {
    pods: Api<Pod>,
    namespace: String,
    name: String,
}

impl TokenPoller {
    /// The poller pod's name.
    pub const NAME: &'static str = "token-poller";

    /// Starts the poller in `namespace` of the tenant `tenant` (the namespace must exist with
    /// its default service account), calling the tenant apiserver at NodePort `node_port`;
    /// returns once the pod runs and its first call was answered.
    pub async fn start(
        tenant: Client,
        namespace: &str,
        node_port: u16,
    ) -> anyhow::Result<TokenPoller> {
        let pods: Api<Pod> = Api::namespaced(tenant, namespace);
        let script = format!("{PY_DEFAULT_GATEWAY}\n{TOKEN_POLLER_PY}");
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": Self::NAME, "labels": {"app": Self::NAME}},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "poller",
                    "image": "vcp.dev/host:any",
                    "command": ["python3", "-u", "-c", script],
                    "env": [{"name": "NODE_PORT", "value": node_port.to_string()}],
                }],
            },
        }))?;
        pods.create(&PostParams::default(), &pod).await?;
        let poller = TokenPoller {
            pods,
            namespace: namespace.to_owned(),
            name: Self::NAME.to_owned(),
        };
        eventually(
            "the token poller's first answered call",
            Duration::from_secs(180),
            || async {
                let p = poller.pods.get(&poller.name).await?;
                let phase = p.status.as_ref().and_then(|s| s.phase.clone());
                anyhow::ensure!(
                    !matches!(phase.as_deref(), Some("Failed" | "Succeeded")),
                    "the token poller stopped ({phase:?}): {:?}\n{}",
                    p.status,
                    poller.log().await.unwrap_or_default()
                );
                if !running(&p) {
                    return Ok(None);
                }
                // The log may not be readable yet (the container only just started).
                let Ok(log) = poller.log().await else {
                    return Ok(None);
                };
                Ok((TokenCounts::from_log(&log).answered > 0).then_some(()))
            },
        )
        .await?;
        Ok(poller)
    }

    /// The pod's log so far.
    pub async fn log(&self) -> anyhow::Result<String> {
        Ok(self
            .pods
            .logs(&self.name, &kube::api::LogParams::default())
            .await?)
    }

    /// The counts so far; fails if the pod no longer runs (its counts would be incomplete).
    pub async fn counts(&self) -> anyhow::Result<TokenCounts> {
        let p = self.pods.get(&self.name).await?;
        let log = self.log().await?;
        anyhow::ensure!(
            running(&p),
            "the token poller is not running: {:?}\n{log}",
            p.status
        );
        Ok(TokenCounts::from_log(&log))
    }

    /// Reads the counts from now on through another tenant client (one that trusts a rotated
    /// CA, say).
    pub fn reconnect(&mut self, tenant: Client) {
        self.pods = Api::namespaced(tenant, &self.namespace);
    }

    /// The final counts, then deletes the pod.
    pub async fn stop(self) -> anyhow::Result<TokenCounts> {
        let counts = self.counts().await?;
        self.pods
            .delete(&self.name, &kube::api::DeleteParams::default())
            .await?;
        Ok(counts)
    }
}

/// A validating webhook configuration `name` with one webhook `webhook` called by URL (with
/// `ca`, PEM, as its bundle) for the creation of ConfigMaps labelled `selector`, failing
/// closed: the shape the tests of a tenant's control-plane egress register.
pub fn webhook_by_url(
    name: &str,
    webhook: &str,
    url: &str,
    ca: Option<&str>,
    selector: (&str, &str),
) -> anyhow::Result<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration> {
    use base64::Engine;
    let mut client_config = serde_json::json!({"url": url});
    if let Some(ca) = ca {
        client_config["caBundle"] =
            serde_json::json!(base64::engine::general_purpose::STANDARD.encode(ca));
    }
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "webhooks": [{
            "name": webhook,
            "clientConfig": client_config,
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}],
            "objectSelector": {"matchLabels": {selector.0: selector.1}},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 10,
        }],
    }))?)
}

/// Runs the `vcp-dev` binary at `exe` (an integration test's `env!("CARGO_BIN_EXE_vcp-dev")`)
/// with `args` and `--state-dir state_dir`, as a user runs it, and returns what it printed.
pub fn vcp_dev_cli(exe: &str, args: &[&str], state_dir: &std::path::Path) -> std::process::Output {
    std::process::Command::new(exe)
        .args(args)
        .arg("--state-dir")
        .arg(state_dir)
        .output()
        .expect("vcp-dev runs")
}

/// Runs `vcp-dev down` on a state dir when dropped, so a failing assertion never leaks a
/// detached cluster.
pub struct DownOnDrop<'a>(pub &'a std::path::Path);

impl Drop for DownOnDrop<'_> {
    fn drop(&mut self) {
        let _ = crate::cluster::down(self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_counts_are_the_last_totals_and_every_failure() {
        let log = "token-poller: calling 10.245.0.1:30443 as kubernetes.default.svc\n\
                   ok answered=1 failed=0 user=system:serviceaccount:apps:default\n\
                   failed answered=1 failed=1 HTTP 401: {\"kind\":\"Status\"}\n\
                   failed answered=1 failed=2 TLS error: certificate verify failed\n\
                   ok answered=2 failed=2 user=system:serviceaccount:apps:default\n\
                   ok answered=3 fail";
        let c = TokenCounts::from_log(log);
        assert_eq!((c.answered, c.failed), (2, 2), "a cut last line is skipped");
        assert_eq!(c.failures.len(), 2);
        assert!(c.failures[0].ends_with("HTTP 401: {\"kind\":\"Status\"}"));
        assert_eq!(TokenCounts::from_log(""), TokenCounts::default());
        // A failure counted without its line is still shown, with the lines around it.
        let lost = "ok answered=1 failed=0 user=u\n\
                    garbled\n\
                    ok answered=2 failed=1 user=u\n";
        let c = TokenCounts::from_log(lost);
        assert_eq!(c.failed, 1);
        assert_eq!(
            c.failures,
            ["(no failure line) before: \"garbled\"; after: \"ok answered=2 failed=1 user=u\""]
        );
    }
}
