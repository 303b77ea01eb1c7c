//! vcp itself on the dev cluster: `vcp serve` as a local process against the dev cluster's
//! Postgres and apiserver, tenants placed on the process node, and a small client of its API.
//!
//! The dev environment exposes tenant apiservers as NodePorts on 127.0.0.1 (the devnode
//! forwards them), and vcp reaches tenants through those endpoints because it runs outside
//! the host cluster's network.

use crate::cluster::{self, DevCluster, SERVICE_CIDR};
use crate::process::{self, ProcSpec, Spawned, Supervision};
use crate::{Error, Result};
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
"#;

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
}

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
        ("VCP_SERVICE_CIDR", SERVICE_CIDR.to_owned()),
        ("VCP_EXPOSE", "node-port".to_owned()),
        ("VCP_EXPOSE_ADDRESS", "127.0.0.1".to_owned()),
        ("VCP_TENANT_ACCESS", "endpoint".to_owned()),
        ("VCP_SYNCER_IMAGE", DEV_SYNCER_IMAGE.to_owned()),
        ("VCP_TOOLS_IMAGE", DEV_TOOLS_IMAGE.to_owned()),
        ("VCP_ADMIN_TOKEN", opts.admin_token.clone()),
        ("VCP_REPLICA_ID", opts.replica_id.clone()),
        ("VCP_WORKERS", opts.workers.to_string()),
        ("VCP_SIMULATE_CONTROL_PLANES", opts.simulate.to_string()),
        (
            "RUST_LOG",
            std::env::var("VCP_TEST_ORCHESTRATOR_LOG").unwrap_or_else(|_| "info".into()),
        ),
    ] {
        spec.env.push((k.into(), v));
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

    /// The same server with another token.
    pub fn with_token(&self, token: &str) -> ApiClient {
        ApiClient {
            token: token.to_owned(),
            ..self.clone()
        }
    }

    async fn ready(&self) -> bool {
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

    pub async fn create_tenant(&self, name: &str) -> anyhow::Result<Value> {
        self.call(
            reqwest::Method::POST,
            "/v1/tenants",
            Some(&json!({"name": name})),
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

/// What `vcp-dev up` set up besides the host cluster.
pub struct DevPlatform {
    pub api_url: String,
    pub admin_token: String,
    pub tenant: Value,
    pub kubeconfig: PathBuf,
    /// The `vcp serve` process when attached (foreground); detached ones are in `state.json`.
    pub orchestrator: Option<Spawned>,
}

/// Starts `vcp serve` against the dev cluster's Postgres, creates tenant `name` (unless it
/// exists), waits until it is Ready and writes `<state>/<name>.kubeconfig` (an admin
/// kubeconfig) and `VCP_API_URL`/`VCP_TOKEN` into `<state>/env`.
pub async fn up(
    cluster: &DevCluster,
    name: &str,
    mode: Supervision,
) -> anyhow::Result<DevPlatform> {
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
    let api = ApiClient::new(&orch.url, &admin_token);
    if api.get_tenant(name).await?.is_none() {
        api.create_tenant(name).await?;
    }
    let tenant = api.wait_ready(name, Duration::from_secs(300)).await?;
    let kc = api
        .kubeconfig(name, &format!("{name}-admin"), &["admin"], "720h")
        .await?;
    let kubeconfig = cluster.state_dir().join(format!("{name}.kubeconfig"));
    cluster::write_secret_file(&kubeconfig, &kc)?;
    cluster::append_env(
        cluster.state_dir(),
        &format!(
            "export VCP_API_URL='{}'\nexport VCP_TOKEN='{admin_token}'\n",
            orch.url
        ),
    )?;
    let orchestrator = match mode {
        Supervision::Attached => Some(orch.proc),
        Supervision::Detached => {
            orch.proc.release();
            None
        }
    };
    Ok(DevPlatform {
        api_url: orch.url,
        admin_token,
        tenant,
        kubeconfig,
        orchestrator,
    })
}
