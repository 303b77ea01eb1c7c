//! vcp itself on the dev cluster, and a small client of its API. Two ways, as `vcp-dev up`
//! offers them:
//!
//! - [`Mode::Chart`] (the default): vcp installed with its Helm chart ([`crate::chart`]), two
//!   replicas and the evaluation Postgres as pods on the process node, the API reached through
//!   the Service's NodePort on 127.0.0.1: the path a user takes.
//! - [`Mode::Local`]: `vcp serve` as a local process against the dev cluster's Postgres and
//!   apiserver, reaching tenants through their NodePorts on 127.0.0.1 because it runs outside
//!   the host cluster's network (quicker to iterate on vcp: no pods, one log file).
//!
//! Either way the platform provisions a tenant through the API, writes its admin kubeconfig and
//! adds `VCP_API_URL` and an admin `VCP_TOKEN` to `<state>/env`; `<state>/platform.json` records
//! the mode and the API address for `vcp-dev status` and the next `up`.

use crate::cluster::{self, DevCluster, SERVICE_CIDR};
use crate::process::{self, ProcSpec, Spawned, Supervision};
use crate::{Error, Result, chart};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Plans of the dev environment: control planes run on the process node.
pub const DEV_PLANS: &str = r#"# Control-plane pods go to the dev cluster's process node (vcp-devnode); tenant workloads
# to the simulated kwok workers, under the default (restrictive) tenant policy otherwise.
default:
  node_selector: {vcp.dev/runtime: process}
  tolerations: [{key: vcp.dev/runtime, operator: Equal, value: process, effect: NoSchedule}]
  policy:
    placement:
      node_selector: {type: kwok}
# As default, but tenant workloads run on the process node too, as real processes: for tests
# whose tenant pods must really do something (call their apiserver with their token).
process-workloads:
  node_selector: {vcp.dev/runtime: process}
  tolerations: [{key: vcp.dev/runtime, operator: Equal, value: process, effect: NoSchedule}]
  policy:
    placement:
      node_selector: {vcp.dev/runtime: process}
      tolerations: [{key: vcp.dev/runtime, operator: Exists}]
# As process-workloads, with a quota of one pod: a plan change to it is refused while the
# tenant's last usage sample holds more (orchestrator/tests/datastore.rs).
one-pod:
  node_selector: {vcp.dev/runtime: process}
  tolerations: [{key: vcp.dev/runtime, operator: Equal, value: process, effect: NoSchedule}]
  policy:
    quota: {pods: 1}
    placement:
      node_selector: {vcp.dev/runtime: process}
      tolerations: [{key: vcp.dev/runtime, operator: Exists}]
# As default, asleep after a minute with no connection through the gateway and no running
# workload (orchestrator/tests/sleep.rs).
sleepy:
  node_selector: {vcp.dev/runtime: process}
  tolerations: [{key: vcp.dev/runtime, operator: Equal, value: process, effect: NoSchedule}]
  sleep: {after_idle_minutes: 1}
  policy:
    placement:
      node_selector: {type: kwok}
# As default, with ConfigMaps encrypted in etcd beside Secrets (orchestrator/tests/encryption.rs).
encrypted-configmaps:
  node_selector: {vcp.dev/runtime: process}
  tolerations: [{key: vcp.dev/runtime, operator: Equal, value: process, effect: NoSchedule}]
  encryption: {resources: [secrets, configmaps]}
  policy:
    placement:
      node_selector: {type: kwok}
# As default, with a snapshot every hour, the newest two kept (orchestrator/tests/backup.rs).
backed-up:
  node_selector: {vcp.dev/runtime: process}
  tolerations: [{key: vcp.dev/runtime, operator: Equal, value: process, effect: NoSchedule}]
  backups: {hourly: 2}
  policy:
    placement:
      node_selector: {type: kwok}
# As process-workloads, with three etcd members: a store that keeps its quorum while its
# members restart one at a time.
ha-process-workloads:
  node_selector: {vcp.dev/runtime: process}
  tolerations: [{key: vcp.dev/runtime, operator: Equal, value: process, effect: NoSchedule}]
  etcd_replicas: 3
  policy:
    placement:
      node_selector: {vcp.dev/runtime: process}
      tolerations: [{key: vcp.dev/runtime, operator: Exists}]
# As process-workloads, with its data on the shared datastore `shared` (DEV_DATASTORES) under
# its own prefix and etcd user, instead of an etcd of its own.
shared:
  node_selector: {vcp.dev/runtime: process}
  tolerations: [{key: vcp.dev/runtime, operator: Equal, value: process, effect: NoSchedule}]
  datastore: shared
  policy:
    placement:
      node_selector: {vcp.dev/runtime: process}
      tolerations: [{key: vcp.dev/runtime, operator: Exists}]
"#;

/// The shared datastores of the dev environment's `vcp serve` (`--datastores`): three etcd
/// members on the process node, started when the first tenant of a plan naming it is.
/// `shared-real` is the same on the real node, for [`REAL_NODE_PLANS`] (its members are real
/// containers, measured by `vcp-dev bench density --plan lean-shared`).
pub const DEV_DATASTORES: &str = r#"shared:
  members: 3
  node_selector: {vcp.dev/runtime: process}
  tolerations: [{key: vcp.dev/runtime, operator: Equal, value: process, effect: NoSchedule}]
  storage: 1Gi
shared-real:
  members: 3
  node_selector: {vcp.dev/node: real}
  tolerations: [{key: vcp.dev/node, operator: Equal, value: real, effect: NoSchedule}]
  storage: 1Gi
  snapshot_count: 1000
  gogc: 50
  memory_limit_mib: 96
"#;

/// The plan of [`DEV_PLANS`] whose tenants keep their data on [`DEV_DATASTORES`]' `shared`.
pub const SHARED_PLAN: &str = "shared";

/// The plan of [`DEV_PLANS`] whose tenant workloads run on the process node.
pub const PROCESS_WORKLOADS_PLAN: &str = "process-workloads";
/// The plan of [`DEV_PLANS`] that encrypts ConfigMaps beside Secrets.
pub const ENCRYPTED_CONFIGMAPS_PLAN: &str = "encrypted-configmaps";
/// The plan of [`DEV_PLANS`] with hourly backups, two kept.
pub const BACKED_UP_PLAN: &str = "backed-up";
/// [`PROCESS_WORKLOADS_PLAN`] with three etcd members.
pub const HA_PROCESS_WORKLOADS_PLAN: &str = "ha-process-workloads";

/// Image name of the syncer in the dev environment (the devnode maps it to the workspace build).
pub const DEV_SYNCER_IMAGE: &str = "vcp.dev/vcp-syncer:dev";
/// Image of `vcp` itself (snapshot and restore Jobs), mapped to the workspace build likewise.
pub const DEV_TOOLS_IMAGE: &str = "vcp.dev/vcp:dev";

/// The workspace's `vcp` binary (next to the devnode's).
pub fn orchestrator_binary() -> Result<PathBuf> {
    let path = cluster::devnode_binary()?.with_file_name("vcp");
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::MissingBinary {
            component: "vcp".into(),
            version: "workspace".into(),
            path,
        })
    }
}

pub use crate::pki::new_token;

/// The inventory key (`--inventory-key`) of every `vcp serve` the dev harness starts: the
/// base64 of `vcp-dev-inventory-key-not-secret`. One fixed key, so that replicas of one
/// inventory (and a replica restarted over it) open each other's tenant keys; for development
/// only (the chart generates a random one per release).
pub const DEV_INVENTORY_KEY: &str = "dmNwLWRldi1pbnZlbnRvcnkta2V5LW5vdC1zZWNyZXQ=";

/// How to start `vcp serve`.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub database_url: String,
    pub admin_token: String,
    pub replica_id: String,
    pub workers: u16,
    /// Fixed port, or a free one.
    pub port: Option<u16>,
    /// Place control planes on kwok nodes and count Ready pods as serving
    /// (`--simulate-control-planes`; for measuring vcp's own overhead at scale).
    pub simulate: bool,
    /// More `VCP_*` settings, after (so overriding) the defaults above: a test's own
    /// templates directory, a short hop timeout.
    pub extra_env: Vec<(String, String)>,
    /// Upload snapshots to the dev cluster's S3 server ([`crate::s3`]) under this prefix
    /// (`--backup-store`); none: they stay on their claims.
    pub backup_prefix: Option<String>,
}

/// Plans of a dev cluster with a real node ([`crate::node`]): control planes and tenant
/// workloads run there as containers.
pub const REAL_NODE_PLANS: &str = r#"default:
  node_selector: {vcp.dev/node: real}
  tolerations: [{key: vcp.dev/node, operator: Equal, value: real, effect: NoSchedule}]
  policy:
    placement:
      node_selector: {vcp.dev/node: real}
      tolerations: [{key: vcp.dev/node, operator: Exists}]
# As default, plus what the Kubernetes conformance suite needs and the default plan refuses:
# host namespaces and hostPath (privileged), NodePort Services, and the suite's runtime
# handler whatever the tenant names its class. For certification runs, not for tenants one
# does not trust (docs/conformance.md, "The conformance plan").
conformance:
  node_selector: {vcp.dev/node: real}
  tolerations: [{key: vcp.dev/node, operator: Equal, value: real, effect: NoSchedule}]
  policy:
    pod_security: privileged
    placement:
      node_selector: {vcp.dev/node: real}
      tolerations: [{key: vcp.dev/node, operator: Exists}]
    scheduling:
      runtime_handlers: {test-handler: test-handler}
    services:
      node_port_services: 20
      node_ports: 40
    # The default quota without its totals of CPU and memory, so a container gets no request
    # or limit it did not ask for, as the in-place resize tests expect of its status and cgroup.
    quota:
      pods: 100
      services: 50
      persistent_volume_claims: 20
      requests_storage: 200Gi
      namespaces: 20
      limits: {default_request: null, default_limit: null}
# As default, with the control plane tuned for memory (docs/orchestrator.md, "Plans"): what
# `vcp-dev bench density --plan lean` measures against the default plan.
lean:
  node_selector: {vcp.dev/node: real}
  tolerations: [{key: vcp.dev/node, operator: Equal, value: real, effect: NoSchedule}]
  policy:
    placement:
      node_selector: {vcp.dev/node: real}
      tolerations: [{key: vcp.dev/node, operator: Exists}]
  tuning:
    gogc: 50
    memory_limit_mib: {kube-apiserver: 128, kube-controller-manager: 40, etcd: 40, coredns: 20}
    apiserver_watch_cache: false
    etcd_snapshot_count: 1000
# As lean, with the data on the shared datastore `shared-real` (DEV_DATASTORES) instead of an
# etcd per tenant: what `vcp-dev bench density --plan lean-shared` measures.
lean-shared:
  node_selector: {vcp.dev/node: real}
  tolerations: [{key: vcp.dev/node, operator: Equal, value: real, effect: NoSchedule}]
  datastore: shared-real
  policy:
    placement:
      node_selector: {vcp.dev/node: real}
      tolerations: [{key: vcp.dev/node, operator: Exists}]
  tuning:
    gogc: 50
    memory_limit_mib: {kube-apiserver: 128, kube-controller-manager: 40, coredns: 20}
    apiserver_watch_cache: false
"#;

/// The plan of [`REAL_NODE_PLANS`] that passes the conformance suite.
pub const CONFORMANCE_PLAN: &str = "conformance";

/// Plans of the simulation: control-plane pods on the kwok workers.
pub const SIMULATED_PLANS: &str = "default: {node_selector: {type: kwok}}\n";

/// A started `vcp serve`.
pub struct Orchestrator {
    pub url: String,
    pub proc: Spawned,
}

/// Starts `vcp serve` for `cluster`, with its files and log in `dir`, and waits for `/readyz`.
pub async fn start_orchestrator(
    cluster: &DevCluster,
    dir: &Path,
    opts: &ServeOptions,
    mode: Supervision,
) -> Result<Orchestrator> {
    std::fs::create_dir_all(dir).map_err(Error::io(dir))?;
    let plans = dir.join("plans.yaml");
    let plan_text = if opts.simulate {
        SIMULATED_PLANS
    } else {
        DEV_PLANS
    };
    std::fs::write(&plans, plan_text).map_err(Error::io(&plans))?;
    let datastores = dir.join("datastores.yaml");
    let datastores_text = if opts.simulate { "{}" } else { DEV_DATASTORES };
    std::fs::write(&datastores, datastores_text).map_err(Error::io(&datastores))?;
    let port = match opts.port {
        Some(p) => p,
        None => {
            let [p] = process::free_ports()?;
            p
        }
    };
    let url = format!("http://127.0.0.1:{port}");
    let p = |x: &Path| x.to_string_lossy().into_owned();
    let mut spec = ProcSpec::new(&opts.replica_id, orchestrator_binary()?).args(["serve"]);
    for (k, v) in [
        ("VCP_DATABASE_URL", opts.database_url.clone()),
        ("VCP_HOST_KUBECONFIG", p(cluster.kubeconfig_path())),
        ("VCP_LISTEN", format!("127.0.0.1:{port}")),
        ("VCP_PLANS", p(&plans)),
        ("VCP_DATASTORES", p(&datastores)),
        ("VCP_SERVICE_CIDR", SERVICE_CIDR.to_owned()),
        ("VCP_EXPOSE", "node-port".to_owned()),
        ("VCP_EXPOSE_ADDRESS", "127.0.0.1".to_owned()),
        ("VCP_TENANT_ACCESS", "endpoint".to_owned()),
        ("VCP_SYNCER_IMAGE", DEV_SYNCER_IMAGE.to_owned()),
        ("VCP_TOOLS_IMAGE", DEV_TOOLS_IMAGE.to_owned()),
        ("VCP_ADMIN_TOKEN", opts.admin_token.clone()),
        ("VCP_INVENTORY_KEY", DEV_INVENTORY_KEY.to_owned()),
        ("VCP_REPLICA_ID", opts.replica_id.clone()),
        ("VCP_WORKERS", opts.workers.to_string()),
        ("VCP_SIMULATE_CONTROL_PLANES", opts.simulate.to_string()),
        // Clients dial a local process directly, with no balancer to drain from: stopping
        // it need not wait (the chart's replicas keep the default).
        ("VCP_DRAIN_SECONDS", "0".to_owned()),
        (
            "RUST_LOG",
            std::env::var("VCP_TEST_ORCHESTRATOR_LOG").unwrap_or_else(|_| "info".into()),
        ),
    ] {
        spec.env.push((k.into(), v));
    }
    if let Some(prefix) = &opts.backup_prefix {
        let s3 = cluster.state().s3.as_ref().ok_or_else(|| {
            Error::InvalidOption("this dev cluster runs no S3 server for backups".into())
        })?;
        let store = dir.join("backup-store.yaml");
        std::fs::write(&store, s3.store_file(prefix)).map_err(Error::io(&store))?;
        let (access, secret) = s3.credentials()?;
        spec.env.push(("VCP_BACKUP_STORE".into(), p(&store)));
        spec.env.push(("VCP_BACKUP_ACCESS_KEY_ID".into(), access));
        spec.env
            .push(("VCP_BACKUP_SECRET_ACCESS_KEY".into(), secret));
    }
    spec.env.extend(opts.extra_env.iter().cloned());
    let log = dir.join(format!("{}.log", opts.replica_id));
    let mut proc = process::spawn(&spec, mode, &log)?;
    let api = ApiClient::new(&url, &opts.admin_token);
    let start = Instant::now();
    loop {
        proc.check_running()?;
        if api.ready().await {
            break;
        }
        if start.elapsed() > Duration::from_secs(60) {
            return Err(Error::Unhealthy {
                component: opts.replica_id.clone(),
                secs: 60,
                log,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(Orchestrator { url, proc })
}

/// A small client of the platform API.
#[derive(Debug, Clone)]
pub struct ApiClient {
    pub base: String,
    token: String,
    http: reqwest::Client,
}

/// A non-2xx answer of the API.
#[derive(Debug, thiserror::Error)]
#[error("{method} {path} answered {status}: {body}")]
pub struct ApiError {
    pub method: &'static str,
    pub path: String,
    pub status: u16,
    pub body: String,
}

impl ApiClient {
    pub fn new(base: &str, token: &str) -> ApiClient {
        let _ = rustls::crypto::ring::default_provider().install_default();
        ApiClient {
            base: base.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .expect("an HTTP client builds"),
        }
    }

    /// The bearer token it speaks with (for the `vcp` client a test runs as the same caller).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The same server with another token.
    pub fn with_token(&self, token: &str) -> ApiClient {
        ApiClient {
            token: token.to_owned(),
            ..self.clone()
        }
    }

    pub async fn ready(&self) -> bool {
        matches!(self.http.get(format!("{}/readyz", self.base)).send().await, Ok(r) if r.status().is_success())
    }

    /// Sends a request; returns (status, JSON body or the text as a JSON string).
    pub async fn raw(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await?;
        let status = resp.status().as_u16();
        let text = resp.text().await?;
        let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok((status, v))
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<Value> {
        let m = if method == reqwest::Method::POST {
            "POST"
        } else if method == reqwest::Method::DELETE {
            "DELETE"
        } else {
            "GET"
        };
        let (status, v) = self.raw(method, path, body).await?;
        if !(200..300).contains(&status) {
            return Err(ApiError {
                method: m,
                path: path.to_owned(),
                status,
                body: v.to_string(),
            }
            .into());
        }
        Ok(v)
    }

    /// A new owner's token `name`, made with this (an admin's) client; a client speaking it.
    pub async fn new_owner(&self, name: &str) -> anyhow::Result<ApiClient> {
        let b = self
            .call(
                reqwest::Method::POST,
                "/v1/tokens",
                Some(&json!({"name": name, "role": "owner"})),
            )
            .await?;
        let token = b["token"]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("token {name} made without its secret: {b}"))?;
        Ok(self.with_token(token))
    }

    pub async fn create_tenant(&self, name: &str) -> anyhow::Result<Value> {
        self.call(
            reqwest::Method::POST,
            "/v1/tenants",
            Some(&json!({"name": name})),
        )
        .await
    }

    /// Creates tenant `name` on `plan` (one of the server's plans, e.g.
    /// [`PROCESS_WORKLOADS_PLAN`]).
    pub async fn create_tenant_with_plan(&self, name: &str, plan: &str) -> anyhow::Result<Value> {
        self.call(
            reqwest::Method::POST,
            "/v1/tenants",
            Some(&json!({"name": name, "plan": plan})),
        )
        .await
    }

    /// The tenant, or `None` on 404.
    pub async fn get_tenant(&self, name: &str) -> anyhow::Result<Option<Value>> {
        let (status, v) = self
            .raw(reqwest::Method::GET, &format!("/v1/tenants/{name}"), None)
            .await?;
        match status {
            200 => Ok(Some(v)),
            404 => Ok(None),
            _ => anyhow::bail!("GET /v1/tenants/{name} answered {status}: {v}"),
        }
    }

    pub async fn delete_tenant(&self, name: &str) -> anyhow::Result<Value> {
        self.call(
            reqwest::Method::DELETE,
            &format!("/v1/tenants/{name}"),
            None,
        )
        .await
    }

    /// Waits until the tenant is Ready, printing phase changes; fails on `Failed` or timeout.
    /// Tenant `name`'s snapshots and restores (`GET .../snapshots`).
    pub async fn snapshots(&self, name: &str) -> anyhow::Result<Value> {
        let (s, l) = self
            .raw(
                reqwest::Method::GET,
                &format!("/v1/tenants/{name}/snapshots"),
                None,
            )
            .await?;
        anyhow::ensure!(s == 200, "list the snapshots of {name}: {s} {l}");
        Ok(l)
    }

    /// Asks for a snapshot of tenant `name` (202) and waits until it is taken (an error as
    /// soon as it failed); the snapshot as listed.
    pub async fn take_snapshot(&self, name: &str, timeout: Duration) -> anyhow::Result<Value> {
        let (s, snap) = self
            .raw(
                reqwest::Method::POST,
                &format!("/v1/tenants/{name}/snapshots"),
                None,
            )
            .await?;
        anyhow::ensure!(s == 202, "snapshot of {name}: {s} {snap}");
        let id = snap["id"].clone();
        crate::testing::eventually(&format!("snapshot {id} of {name} taken"), timeout, || {
            let id = id.clone();
            async move {
                let l = self.snapshots(name).await?;
                let s = l["snapshots"]
                    .as_array()
                    .and_then(|a| a.iter().find(|s| s["id"] == id).cloned())
                    .ok_or_else(|| anyhow::anyhow!("no snapshot {id}: {l}"))?;
                anyhow::ensure!(s["state"] != "Failed", "the snapshot failed: {s}");
                Ok((s["state"] == "Succeeded").then_some(s))
            }
        })
        .await
    }

    /// Restores tenant `name` from its snapshot `id` (202) and waits until the restore
    /// succeeded and the tenant is Ready (an error as soon as it failed); the restore.
    pub async fn restore(&self, name: &str, id: i64, timeout: Duration) -> anyhow::Result<Value> {
        let (s, r) = self
            .raw(
                reqwest::Method::POST,
                &format!("/v1/tenants/{name}/restore"),
                Some(&serde_json::json!({"snapshot": id})),
            )
            .await?;
        anyhow::ensure!(s == 202, "restore of {name}: {s} {r}");
        let rid = r["id"].clone();
        crate::testing::eventually(&format!("restore {rid} of {name}"), timeout, || {
            let rid = rid.clone();
            async move {
                let t = self
                    .get_tenant(name)
                    .await?
                    .ok_or_else(|| anyhow::anyhow!("tenant {name} is gone"))?;
                let l = self.snapshots(name).await?;
                let r = l["restores"]
                    .as_array()
                    .and_then(|a| a.iter().find(|r| r["id"] == rid).cloned())
                    .ok_or_else(|| anyhow::anyhow!("no restore {rid}: {l}"))?;
                anyhow::ensure!(r["state"] != "Failed", "the restore failed: {r}");
                Ok((r["state"] == "Succeeded" && t["phase"] == "Ready").then_some(r))
            }
        })
        .await
    }

    pub async fn wait_ready(&self, name: &str, timeout: Duration) -> anyhow::Result<Value> {
        let start = Instant::now();
        let mut last = String::new();
        loop {
            let t = self
                .get_tenant(name)
                .await?
                .ok_or_else(|| anyhow::anyhow!("tenant {name} does not exist"))?;
            let phase = t["phase"].as_str().unwrap_or_default().to_owned();
            let waiting = t["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["status"] == "False" && c["type"] != "Ready")
                .map(|c| {
                    format!(
                        "{}: {}",
                        c["type"].as_str().unwrap_or(""),
                        c["message"].as_str().unwrap_or("")
                    )
                })
                .unwrap_or_default();
            let line = format!("{phase} {waiting}");
            if line != last {
                eprintln!(
                    "  tenant {name}: {line} ({:.1}s)",
                    start.elapsed().as_secs_f64()
                );
                last = line;
            }
            match phase.as_str() {
                "Ready" => return Ok(t),
                "Failed" => anyhow::bail!("tenant {name} failed: {t}"),
                _ => {}
            }
            if start.elapsed() > timeout {
                anyhow::bail!("tenant {name} not Ready after {timeout:?}: {t}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Issues a kubeconfig; returns its YAML.
    pub async fn kubeconfig(
        &self,
        tenant: &str,
        user: &str,
        groups: &[&str],
        ttl: &str,
    ) -> anyhow::Result<String> {
        let v = self
            .call(
                reqwest::Method::POST,
                &format!("/v1/tenants/{tenant}/kubeconfigs"),
                Some(&json!({"user": user, "groups": groups, "ttl": ttl})),
            )
            .await?;
        Ok(v["kubeconfig"].as_str().unwrap_or_default().to_owned())
    }
}

/// How vcp runs in the dev environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Installed with `charts/vcp` into the dev cluster.
    Chart,
    /// `vcp serve` as a local process.
    Local,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Chart => "chart",
            Mode::Local => "local",
        })
    }
}

/// What `up` records in `<state>/platform.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub mode: Mode,
    pub api_url: String,
    pub tenant: String,
    /// Chart mode: the Helm release and its namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Chart mode: the API Service's NodePort, kept by the next `up` of this state dir.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_port: Option<u16>,
    /// Chart mode on the real node: the gateway's NodePort, which every kubeconfig dials, kept
    /// by the next `up` as well.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_port: Option<u16>,
}

fn record_path(dir: &Path) -> PathBuf {
    dir.join("platform.json")
}

/// The platform recorded in a state dir, if `up` set one up there.
pub fn read_record(dir: &Path) -> Result<Option<Record>> {
    let path = record_path(dir);
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| Error::Serde {
                what: "platform.json",
                source: e.into(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(&path)(e)),
    }
}

fn write_record(dir: &Path, r: &Record) -> Result<()> {
    let path = record_path(dir);
    let json = serde_json::to_string_pretty(r).map_err(|e| Error::Serde {
        what: "platform.json",
        source: e.into(),
    })?;
    std::fs::write(&path, json).map_err(Error::io(&path))
}

/// Refuses to set up `mode` where the other mode ran: the chart's release stays in the
/// cluster's etcd across `down`, and two vcps with two inventories would fight over the same
/// host objects.
pub fn check_mode(dir: &Path, mode: Mode) -> Result<()> {
    match read_record(dir)? {
        Some(r) if r.mode != mode => Err(Error::InvalidOption(format!(
            "{} was set up with vcp in {} mode, not {mode}; keep that mode, or start afresh with \
             `vcp-dev down --purge --state-dir {}`",
            dir.display(),
            r.mode,
            dir.display()
        ))),
        _ => Ok(()),
    }
}

/// What `up` checks before it starts anything, so a platform that cannot come up leaves
/// nothing running: the state dir's mode, the workspace's `vcp`, and for the chart, helm.
pub fn preflight(dir: &Path, mode: Mode) -> Result<()> {
    check_mode(dir, mode)?;
    orchestrator_binary()?;
    if mode == Mode::Chart {
        crate::bins::tool("helm")?;
    }
    Ok(())
}

/// The platform's health, as `vcp-dev status` reports it.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    #[serde(flatten)]
    pub record: Record,
    /// The API answered `/readyz` through `api_url`.
    pub healthy: bool,
}

/// Probes the recorded platform's API; `None` when `up` set none up in `dir`.
pub async fn status(dir: &Path) -> Result<Option<Status>> {
    let Some(record) = read_record(dir)? else {
        return Ok(None);
    };
    let healthy = ApiClient::new(&record.api_url, "").ready().await;
    Ok(Some(Status { record, healthy }))
}

/// What `vcp-dev up` set up besides the host cluster.
pub struct DevPlatform {
    pub mode: Mode,
    pub api_url: String,
    pub admin_token: String,
    pub tenant: Value,
    pub kubeconfig: PathBuf,
    /// The `vcp serve` process when local and attached (foreground); detached ones are in
    /// `state.json`, chart-installed ones are pods.
    pub orchestrator: Option<Spawned>,
}

/// Local mode: starts `vcp serve` against the dev cluster's Postgres, then [`provision`].
pub async fn up_local(
    cluster: &DevCluster,
    name: &str,
    plan: Option<&str>,
    mode: Supervision,
) -> anyhow::Result<DevPlatform> {
    preflight(cluster.state_dir(), Mode::Local)?;
    let dir = cluster.state_dir().join("vcp");
    std::fs::create_dir_all(&dir)?;
    // The admin token survives restarts of the state dir, so earlier env files stay valid.
    let token_path = dir.join("admin-token");
    let admin_token = match std::fs::read_to_string(&token_path) {
        Ok(t) => t.trim().to_owned(),
        Err(_) => {
            let t = new_token();
            cluster::write_secret_file(&token_path, &t)?;
            t
        }
    };
    let orch = start_orchestrator(
        cluster,
        &dir,
        &ServeOptions {
            database_url: cluster.database_url().to_owned(),
            admin_token: admin_token.clone(),
            replica_id: "vcp-serve".into(),
            workers: 4,
            port: None,
            simulate: false,
            extra_env: vec![],
            backup_prefix: Some("dev".into()),
        },
        mode,
    )
    .await?;
    cluster::record_component(
        cluster.state_dir(),
        cluster::Component {
            name: "vcp-serve".into(),
            pid: orch.proc.pid,
            exe: orch.proc.exe.clone(),
            port: orch.url.rsplit(':').next().and_then(|p| p.parse().ok()),
            health: Some(format!("{}/readyz", orch.url)),
            log: orch.proc.log.clone(),
        },
    )?;
    let record = Record {
        mode: Mode::Local,
        api_url: orch.url.clone(),
        tenant: name.to_owned(),
        release: None,
        namespace: None,
        node_port: None,
        gateway_port: None,
    };
    let (tenant, kubeconfig) = provision(cluster, &record, plan, &admin_token, "").await?;
    let orchestrator = match mode {
        Supervision::Attached => Some(orch.proc),
        Supervision::Detached => {
            orch.proc.release();
            None
        }
    };
    Ok(DevPlatform {
        mode: Mode::Local,
        api_url: orch.url,
        admin_token,
        tenant,
        kubeconfig,
        orchestrator,
    })
}

/// How long the chart's pods may take to be Ready: Postgres initialises its data directory
/// and vcp's first start migrates the inventory, on a machine shared with other builds.
const CHART_READY_TIMEOUT: Duration = Duration::from_secs(300);

/// Chart mode: `helm upgrade --install` of `charts/vcp` as [`chart::RELEASE`] in
/// [`chart::NAMESPACE`], waits for Postgres and both vcp replicas, reads the admin token from
/// the Secret the chart generated, reaches the API through the Service's NodePort on
/// 127.0.0.1, then [`provision`]. Prints its progress to stderr.
pub async fn up_chart(
    cluster: &DevCluster,
    name: &str,
    plan: Option<&str>,
) -> anyhow::Result<DevPlatform> {
    let dir = cluster.state_dir();
    preflight(dir, Mode::Chart)?;
    let (release, ns) = (chart::RELEASE, chart::NAMESPACE);
    // The same NodePort as the last `up` of this state dir: earlier env files stay valid.
    let recorded = read_record(dir)?;
    let node_port = match recorded.as_ref().and_then(|r| r.node_port) {
        Some(p) => p,
        None => chart::free_node_port()?,
    };
    let gateway_port = match recorded.as_ref().and_then(|r| r.gateway_port) {
        Some(p) => p,
        None => loop {
            let p = chart::free_node_port()?;
            if p != node_port {
                break p;
            }
        },
    };
    let vcp_dir = dir.join("vcp");
    std::fs::create_dir_all(&vcp_dir)?;
    let start = Instant::now();
    // With a real node, everything runs there as containers: its images first.
    let real_node = crate::node::recorded(&dir.join(crate::node::DIR)).map(|(_, net)| net);
    let values = match &real_node {
        Some(net) => {
            let (imgs, _) = crate::images::platform_images(&crate::images::workspace_bin_dir()?)?;
            cluster.import_node_images(&imgs)?;
            let imported = k8s_openapi::jiff::Timestamp::now();
            let restarted = restart_older_vcp_pods(cluster, imported, &imgs).await?;
            eprintln!(
                "  {} images imported into the real node: {:.1}s{}",
                imgs.len(),
                start.elapsed().as_secs_f64(),
                if restarted > 0 {
                    format!(" ({restarted} pods on older builds restarted)")
                } else {
                    String::new()
                }
            );
            chart::real_node_values(net.node_ip(), Some(node_port), gateway_port)
        }
        None => chart::dev_values(Some(node_port)),
    };
    chart::install(
        cluster.kubeconfig_path(),
        release,
        ns,
        &values,
        &vcp_dir.join("values.yaml"),
    )?;
    eprintln!(
        "  helm upgrade --install {release} charts/vcp -n {ns}: {:.1}s",
        start.elapsed().as_secs_f64()
    );
    let client = cluster.connect().await?;
    chart::ready_pods(
        &client,
        dir,
        ns,
        &chart::postgresql_selector(release),
        1,
        "postgresql",
        CHART_READY_TIMEOUT,
    )
    .await?;
    eprintln!("  postgres Ready: {:.1}s", start.elapsed().as_secs_f64());
    chart::ready_pods(
        &client,
        dir,
        ns,
        &chart::orchestrator_selector(release),
        2,
        "vcp",
        CHART_READY_TIMEOUT,
    )
    .await?;
    eprintln!(
        "  2 vcp replicas Ready: {:.1}s",
        start.elapsed().as_secs_f64()
    );
    if real_node.is_some() {
        chart::ready_pods(
            &client,
            dir,
            ns,
            &chart::gateway_selector(release),
            2,
            "vcp-gateway",
            CHART_READY_TIMEOUT,
        )
        .await?;
        eprintln!(
            "  2 gateway replicas Ready: {:.1}s",
            start.elapsed().as_secs_f64()
        );
    }
    let full = chart::fullname(release);
    let admin_token =
        chart::secret_value(&client, ns, &format!("{full}-admin-token"), "token").await?;
    let node_port = chart::node_port(&client, ns, &full).await?;
    // NodePorts: the devnode opens them on the loopback, kube-proxy on the real node's address.
    let api_url = match &real_node {
        Some(net) => format!("http://{}:{node_port}", net.node_ip()),
        None => format!("http://127.0.0.1:{node_port}"),
    };
    // The devnode opens the NodePort once it sees the Service's ready endpoints.
    let api = ApiClient::new(&api_url, &admin_token);
    let reach = Instant::now();
    while !api.ready().await {
        anyhow::ensure!(
            reach.elapsed() < Duration::from_secs(60),
            "the API's NodePort {api_url} did not answer /readyz within 60 s (is another \
             process listening on port {node_port}? see {}/logs/devnode.log)",
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let record = Record {
        mode: Mode::Chart,
        api_url: api_url.clone(),
        tenant: name.to_owned(),
        release: Some(release.to_owned()),
        namespace: Some(ns.to_owned()),
        node_port: Some(node_port),
        gateway_port: real_node.is_some().then_some(gateway_port),
    };
    let note = format!(
        "# vcp runs from its chart: helm release {release} in namespace {ns}, API through the \
         NodePort of service {ns}/{full}.\n# VCP_DATABASE_URL above is the dev cluster's own \
         Postgres, not vcp's inventory (that is {ns}/{full}-postgresql).\n"
    );
    let (tenant, kubeconfig) = provision(cluster, &record, plan, &admin_token, &note).await?;
    Ok(DevPlatform {
        mode: Mode::Chart,
        api_url,
        admin_token,
        tenant,
        kubeconfig,
        orchestrator: None,
    })
}

/// Deletes the pods on the real node that run vcp's own images (the syncer's and vcp's, of
/// `imgs`, by any of their names) in a container started before `imported`: on an `up` of a
/// stopped state dir the kubelet restarts the tenants' syncers and vcp's own pods as soon as
/// it runs, before this `up` has imported the workspace's new build, so they would keep the
/// old one. Their controllers recreate them from the new images. Returns how many were
/// deleted (none on a new state dir).
async fn restart_older_vcp_pods(
    cluster: &DevCluster,
    imported: k8s_openapi::jiff::Timestamp,
    imgs: &[crate::images::Image],
) -> Result<usize> {
    let ours: Vec<&str> = imgs
        .iter()
        .filter(|i| {
            [
                crate::images::VCP_DEV_IMAGE,
                crate::images::SYNCER_DEV_IMAGE,
                crate::images::GATEWAY_DEV_IMAGE,
            ]
            .contains(&i.reference.as_str())
        })
        .flat_map(|i| {
            std::iter::once(i.reference.as_str()).chain(i.also.iter().map(String::as_str))
        })
        .collect();
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, DeleteParams, ListParams};
    let pods: Api<Pod> = Api::all(cluster.client());
    let on_node =
        ListParams::default().fields(&format!("spec.nodeName={}", crate::node::NODE_NAME));
    let list = pods
        .list(&on_node)
        .await
        .map_err(Error::kube("list the real node's pods"))?;
    let mut deleted = 0;
    for p in list.items {
        let older = p
            .status
            .iter()
            .flat_map(|s| s.container_statuses.iter().flatten())
            .filter(|c| ours.contains(&c.image.as_str()))
            .filter_map(|c| c.state.as_ref()?.running.as_ref()?.started_at.as_ref())
            .any(|t| t.0 < imported);
        let (Some(ns), Some(name)) = (&p.metadata.namespace, &p.metadata.name) else {
            continue;
        };
        if older {
            Api::<Pod>::namespaced(cluster.client(), ns)
                .delete(name, &DeleteParams::default())
                .await
                .map_err(Error::kube("restart a pod of an older vcp build"))?;
            deleted += 1;
        }
    }
    Ok(deleted)
}

/// Creates tenant `record.tenant` through the API (unless it exists; on `plan`, the server's
/// default plan if `None`; an existing tenant on another plan is an error), waits until it is Ready,
/// writes `<state>/<tenant>.kubeconfig` (an admin kubeconfig), records the platform, adds
/// `note`, `VCP_API_URL` and `VCP_TOKEN` to `<state>/env` and puts the workspace's `vcp` client
/// in `<state>/bin` (on the env file's `PATH`).
async fn provision(
    cluster: &DevCluster,
    record: &Record,
    plan: Option<&str>,
    admin_token: &str,
    note: &str,
) -> anyhow::Result<(Value, PathBuf)> {
    let name = &record.tenant;
    let api = ApiClient::new(&record.api_url, admin_token);
    match (api.get_tenant(name).await?, plan) {
        (None, None) => {
            api.create_tenant(name).await?;
        }
        (None, Some(plan)) => {
            api.create_tenant_with_plan(name, plan).await?;
        }
        (Some(found), Some(plan)) if found["plan"].as_str() != Some(plan) => anyhow::bail!(
            "tenant {name} exists on plan {}, not {plan}: choose another --tenant, or delete it first (vcp tenant delete {name})",
            found["plan"].as_str().unwrap_or("?")
        ),
        (Some(_), _) => {}
    }
    let tenant = api.wait_ready(name, Duration::from_secs(300)).await?;
    let kc = api
        .kubeconfig(name, &format!("{name}-admin"), &["admin"], "168h")
        .await?;
    let kubeconfig = cluster.state_dir().join(format!("{name}.kubeconfig"));
    cluster::write_secret_file(&kubeconfig, &kc)?;
    write_record(cluster.state_dir(), record)?;
    let client = cluster.state_dir().join("bin/vcp");
    let _ = std::fs::remove_file(&client);
    std::os::unix::fs::symlink(orchestrator_binary()?, &client).map_err(Error::io(&client))?;
    cluster::append_env(
        cluster.state_dir(),
        &format!(
            "{note}export VCP_API_URL='{}'\nexport VCP_TOKEN='{admin_token}'\n",
            record.api_url
        ),
    )?;
    Ok((tenant, kubeconfig))
}
