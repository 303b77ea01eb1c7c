//! The host cluster: start, inspect, stop.
//!
//! Start order, each step gated on the previous one being healthy: binaries resolved (fail
//! before anything runs) -> PKI (generated once per state dir) -> etcd -> kube-apiserver
//! (`/readyz`) -> kubeconfigs -> controller-manager, scheduler, kwok, PV provisioner -> worker
//! Nodes and the default StorageClass -> all Nodes Ready -> the S3 server of backups on the
//! devnode's gateway ([`crate::s3`]). Postgres starts alongside. What was
//! started is recorded in `<state>/state.json`, which `status` and `down` read back.
//!
//! Everything listens on free ports of 127.0.0.1 (S3 on the devnode's gateway). The apiserver advertises a documentation-only
//! address (RFC 5737) and runs with `--endpoint-reconciler-type=none`: Kubernetes rejects
//! loopback addresses in Endpoints, and no pod on this machine could use that address anyway.

use crate::pki::{self, ClusterPki};
use crate::process::{self, ProcSpec, Spawned, Supervision};
use crate::provisioner::{self, Provisioner};
use crate::{Error, Result, bins, kubeconfig, postgres};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Service ClusterIP range of the host cluster (tenant apiservers reuse it).
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// ClusterIP of the `kubernetes` Service: the first address of [`SERVICE_CIDR`].
pub const KUBERNETES_SERVICE_IP: [u8; 4] = [10, 96, 0, 1];
/// The address the apiserver advertises: TEST-NET-1 (RFC 5737), data only, never dialled.
pub const ADVERTISE_ADDRESS: &str = "192.0.2.1";
/// Label on every simulated worker node.
pub const KWOK_NODE_LABEL: (&str, &str) = ("type", "kwok");
/// Name of the default StorageClass, served by the dev provisioner.
pub const STORAGE_CLASS: &str = "standard";
/// Name of the process-running node.
pub const DEVNODE_NAME: &str = "devnode-0";
/// Field manager of everything vcp-dev applies.
pub const FIELD_MANAGER: &str = "vcp-dev";

const KWOK_STAGES: &str = include_str!("kwok-stages.yaml");
const STARTUP_TIMEOUT: Duration = Duration::from_secs(120);
const STOP_GRACE: Duration = Duration::from_secs(10);

/// How to start a cluster.
#[derive(Debug, Clone)]
pub struct Options {
    pub state_dir: PathBuf,
    /// Simulated worker nodes.
    pub workers: u32,
    pub supervision: Supervision,
    /// Also start the real node ([`crate::node`]): kubelet, containerd and runc, running
    /// containers from images built here.
    pub real_node: bool,
}

/// What `state.json` records about a started cluster.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct State {
    pub kubernetes_version: String,
    pub apiserver_url: String,
    pub kubeconfig: PathBuf,
    pub database_url: String,
    pub service_cidr: String,
    pub workers: u32,
    pub components: Vec<Component>,
    /// The S3-compatible server for backups ([`crate::s3`]).
    #[serde(default)]
    pub s3: Option<crate::s3::S3Record>,
}

/// One started process.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Component {
    pub name: String,
    pub pid: u32,
    pub exe: PathBuf,
    pub port: Option<u16>,
    /// URL answering 2xx when healthy (https ones are verified against the cluster CA).
    pub health: Option<String>,
    pub log: PathBuf,
}

/// Wall-clock milestones of a start.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    /// From the start call until the apiserver's `/readyz` answered.
    pub apiserver_ready: Duration,
    /// From the start call until every worker Node was Ready.
    pub nodes_ready: Duration,
    /// From the start call until everything, Postgres included, was up.
    pub total: Duration,
    /// With a real node: how long writing and importing its start images took.
    pub node_images: Option<Duration>,
}

/// A running host cluster. In attached mode it owns its processes and stops them on drop;
/// in detached mode (`vcp-dev up`) it is only a view, and `down` stops the processes.
pub struct DevCluster {
    state_dir: PathBuf,
    state: State,
    client: Client,
    procs: Vec<Spawned>,
    provisioner: Option<Provisioner>,
    timings: Timings,
    // Declared last so the directory goes after the processes using it.
    _tmp: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for DevCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevCluster")
            .field("state_dir", &self.state_dir)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl DevCluster {
    /// Starts a cluster with 3 workers in a temporary state dir, torn down on drop.
    pub async fn start() -> Result<DevCluster> {
        Self::start_workers(3).await
    }

    /// Starts a cluster with `workers` kwok workers (1 to 16, each takes 4,000 pods) in a
    /// temporary state dir, torn down on drop.
    pub async fn start_workers(workers: u32) -> Result<DevCluster> {
        let tmp = tempfile::Builder::new()
            .prefix("vcp-dev-")
            .tempdir()
            .map_err(Error::io(std::env::temp_dir()))?;
        let opts = Options {
            state_dir: tmp.path().to_owned(),
            workers,
            supervision: Supervision::Attached,
            real_node: false,
        };
        let mut cluster = Self::start_with(opts).await?;
        cluster._tmp = Some(tmp);
        Ok(cluster)
    }

    /// Starts a cluster as `opts` says.
    pub async fn start_with(opts: Options) -> Result<DevCluster> {
        boot(opts).await
    }

    /// A client with cluster-admin rights, bound to the async runtime that started the
    /// cluster; from any other runtime (another `#[tokio::test]`), use [`DevCluster::connect`].
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// A new cluster-admin client for the current async runtime.
    pub async fn connect(&self) -> Result<Client> {
        client_from(&self.state.kubeconfig).await
    }

    /// One cluster per test binary, started by the first test that asks and shared by all
    /// tests of that binary (each test should work in its own namespace). It lives in a
    /// `vcp-dev-shared-*` temp dir; its processes die with the test process, and a later run
    /// removes dirs left by runs that are gone.
    pub async fn shared() -> Result<&'static DevCluster> {
        static SHARED: tokio::sync::OnceCell<DevCluster> = tokio::sync::OnceCell::const_new();
        SHARED
            .get_or_try_init(|| async {
                remove_stale_shared_dirs();
                let dir = tempfile::Builder::new()
                    .prefix("vcp-dev-shared-")
                    .tempdir()
                    .map_err(Error::io(std::env::temp_dir()))?
                    .keep();
                let c = Self::start_with(Options {
                    state_dir: dir,
                    workers: 3,
                    supervision: Supervision::Attached,
                    real_node: false,
                })
                .await?;
                let t = c.timings();
                eprintln!(
                    "vcp-dev: shared cluster up: apiserver {:.2}s, nodes Ready {:.2}s, total {:.2}s",
                    t.apiserver_ready.as_secs_f64(),
                    t.nodes_ready.as_secs_f64(),
                    t.total.as_secs_f64()
                );
                Ok(c)
            })
            .await
    }

    /// Path of the admin kubeconfig.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.state.kubeconfig
    }

    /// URL of the cluster's Postgres.
    pub fn database_url(&self) -> &str {
        &self.state.database_url
    }

    /// What was started.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// Where the state lives.
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// How long the start took.
    pub fn timings(&self) -> Timings {
        self.timings
    }

    /// The kubectl built for this cluster's version.
    pub fn kubectl(&self) -> PathBuf {
        self.state_dir.join("bin/kubectl")
    }

    /// Each process this handle started, alive or not, with the end of its log
    /// ([`process::postmortem`]); for a failure's report.
    pub fn postmortem(&self) -> String {
        process::postmortem(&self.procs, 8)
    }

    /// The real node's layout and network; an error if the cluster has none.
    pub fn real_node(&self) -> Result<(crate::node::Layout, crate::node::NodeNet)> {
        crate::node::recorded(&self.state_dir.join(crate::node::DIR))
            .ok_or_else(|| Error::Node("this dev cluster has no real node (--real-node)".into()))
    }

    /// The world outside the cluster, linked to the real node ([`crate::outside`]).
    pub fn outside(&self) -> Result<crate::outside::Outside> {
        let (_, net) = self.real_node()?;
        crate::outside::Outside::wire(net)
    }

    /// Imports images into the real node's containerd.
    pub fn import_node_images(&self, imgs: &[crate::images::Image]) -> Result<()> {
        let (layout, net) = self.real_node()?;
        crate::node::import(&layout, &net, imgs)
    }

    /// Kills the real node outright (its supervisor, so the kubelet, containerd, kube-proxy
    /// and every container die at once, as in a power loss) and starts it again on the same
    /// state: the same network, containerd's images and the kubelet's pods. Attached clusters
    /// only.
    pub fn restart_real_node(&mut self) -> Result<()> {
        let (layout, net) = self.real_node()?;
        let i = self
            .procs
            .iter()
            .position(|p| p.name == "node")
            .ok_or_else(|| Error::Node("the real node is not this handle's to restart".into()))?;
        self.procs[i].stop(Duration::ZERO);
        crate::node::wait_emptied(&net, Duration::from_secs(60))?;
        self.procs[i] = crate::node::spawn(&layout, &net, Supervision::Attached)?;
        Ok(())
    }

    /// Stops everything this handle owns (attached mode). Safe to call twice.
    pub fn stop(&mut self) {
        if let Some(p) = self.provisioner.take() {
            p.stop();
        }
        if self.procs.is_empty() {
            // Detached (or already stopped): the processes are not ours to stop.
            return;
        }
        for p in self.procs.iter_mut().rev() {
            p.stop(STOP_GRACE);
        }
        self.procs.clear();
        // The devnode removes its network on SIGTERM; this covers one that could not.
        crate::devnet::sweep_recorded(&self.state_dir.join("devnode"));
        crate::node::sweep(&self.state_dir.join(crate::node::DIR));
    }
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

fn remove_stale_shared_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let shared = e
            .file_name()
            .to_string_lossy()
            .starts_with("vcp-dev-shared-");
        // A dir still starting has no state yet; leave anything touched in the last minutes.
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().unwrap_or_default() > Duration::from_secs(600));
        // Nothing of it runs any more: its test process is gone (and took its processes along).
        // down() also sweeps a network its killed devnode left behind.
        if shared && old && running_component(&path).is_none() && down(&path).is_ok() {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// Reads `<dir>/state.json`.
pub fn read_state(dir: &Path) -> Result<State> {
    let path = dir.join("state.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::NoState(dir.to_owned()));
        }
        Err(e) => return Err(Error::io(&path)(e)),
    };
    serde_json::from_str(&text).map_err(|e| Error::Serde {
        what: "state.json",
        source: e.into(),
    })
}

fn write_state(dir: &Path, state: &State) -> Result<()> {
    let json = serde_json::to_string_pretty(state).map_err(|e| Error::Serde {
        what: "state.json",
        source: e.into(),
    })?;
    write_atomic(&dir.join("state.json"), &json)
}

fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(Error::io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(Error::io(path))
}

fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(Error::io(path))?;
    f.write_all(text.as_bytes()).map_err(Error::io(path))
}

/// Adds a component started after the cluster (vcp itself) to `state.json`, so `status`
/// probes it and `down` stops it.
pub fn record_component(dir: &Path, c: Component) -> Result<()> {
    let mut state = read_state(dir)?;
    state.components.retain(|x| x.name != c.name);
    state.components.push(c);
    write_state(dir, &state)
}

/// Appends lines to the `env` file that `up` wrote.
pub fn append_env(dir: &Path, lines: &str) -> Result<()> {
    let path = dir.join("env");
    let mut text = std::fs::read_to_string(&path).map_err(Error::io(&path))?;
    text.push_str(lines);
    write_atomic(&path, &text)
}

/// Writes a file only its owner can read.
pub fn write_secret_file(path: &Path, text: &str) -> Result<()> {
    write_private(path, text)
}

/// The first live component recorded in a state dir, if any.
pub fn running_component(dir: &Path) -> Option<Component> {
    let state = read_state(dir).ok()?;
    state
        .components
        .into_iter()
        .find(|c| process::runs(c.pid, &c.exe))
}

/// Stops every component recorded in `dir`, newest first. Returns how many were running.
/// Running it on a stopped (or never started) dir does nothing and succeeds.
pub fn down(dir: &Path) -> Result<usize> {
    let mut state = match read_state(dir) {
        Ok(s) => s,
        Err(Error::NoState(_)) => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut stopped = 0;
    for c in state.components.iter().rev() {
        // A leader that is gone may leave group members behind (postgres backends); a live pid
        // running something else is a recycled pid and not ours.
        let ours = process::runs(c.pid, &c.exe)
            || (!process::pid_alive(c.pid) && !process::group_members(c.pid).is_empty());
        if ours {
            tracing::info!(component = %c.name, pid = c.pid, "stopping");
            process::stop_group(c.pid, STOP_GRACE);
            stopped += 1;
        }
    }
    // A devnode that was killed outright could not remove its network.
    crate::devnet::sweep_recorded(&dir.join("devnode"));
    crate::node::sweep(&dir.join(crate::node::DIR));
    state.components.clear();
    write_state(dir, &state)?;
    Ok(stopped)
}

/// Health of one component, as `status` reports it.
#[derive(Debug, Clone, Serialize)]
pub struct ComponentStatus {
    pub name: String,
    pub pid: u32,
    pub port: Option<u16>,
    pub running: bool,
    pub healthy: bool,
}

/// Probes every component recorded in `dir`.
pub async fn status(dir: &Path) -> Result<Vec<ComponentStatus>> {
    let state = read_state(dir)?;
    let ca = std::fs::read_to_string(dir.join("pki/ca.crt"))
        .map_err(Error::io(dir.join("pki/ca.crt")))?;
    let mut out = Vec::new();
    for c in &state.components {
        let running = process::runs(c.pid, &c.exe);
        let healthy = running
            && match (&c.health, c.port) {
                (Some(url), _) => probe(url, &ca).await,
                (None, Some(port)) => tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_ok(),
                (None, None) => true,
            };
        out.push(ComponentStatus {
            name: c.name.clone(),
            pid: c.pid,
            port: c.port,
            running,
            healthy,
        });
    }
    Ok(out)
}

/// Whether `url` answers 2xx within two seconds; https is verified against `ca_pem`.
pub async fn probe(url: &str, ca_pem: &str) -> bool {
    let Ok(uri) = url.parse::<http::Uri>() else {
        return false;
    };
    let path = uri
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or("/".into());
    let Ok(base) = format!(
        "{}://{}",
        uri.scheme_str().unwrap_or("http"),
        uri.authority().map(|a| a.as_str()).unwrap_or("")
    )
    .parse() else {
        return false;
    };
    let mut config = kube::Config::new(base);
    config.root_cert = Some(pem_certs_der(ca_pem));
    config.connect_timeout = Some(Duration::from_secs(1));
    config.read_timeout = Some(Duration::from_secs(2));
    let Ok(client) = Client::try_from(config) else {
        return false;
    };
    let Ok(req) = http::Request::get(path).body(Vec::new()) else {
        return false;
    };
    client.request_text(req).await.is_ok()
}

/// DER bytes of every certificate in a PEM bundle.
fn pem_certs_der(pem: &str) -> Vec<Vec<u8>> {
    use base64::Engine;
    pem.split("-----BEGIN CERTIFICATE-----")
        .skip(1)
        .filter_map(|block| {
            let body: String = block
                .split("-----END CERTIFICATE-----")
                .next()?
                .split_whitespace()
                .collect();
            base64::engine::general_purpose::STANDARD.decode(body).ok()
        })
        .collect()
}

/// Waits until `url` is healthy, failing early if the process died.
async fn wait_healthy(proc: &mut Spawned, url: &str, ca_pem: &str) -> Result<()> {
    let started = Instant::now();
    loop {
        proc.check_running()?;
        if probe(url, ca_pem).await {
            tracing::info!(component = %proc.name, elapsed_ms = started.elapsed().as_millis() as u64, "healthy");
            return Ok(());
        }
        if started.elapsed() > STARTUP_TIMEOUT {
            return Err(Error::Unhealthy {
                component: proc.name.clone(),
                secs: STARTUP_TIMEOUT.as_secs(),
                log: proc.log.clone(),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn p(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

struct Layout {
    dir: PathBuf,
}

impl Layout {
    fn pki(&self, name: &str) -> String {
        p(&self.dir.join("pki").join(name))
    }
    fn log(&self, name: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{name}.log"))
    }
    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// Writes the PKI once per state dir; a restarted cluster keeps its identity and data.
fn ensure_pki(l: &Layout) -> Result<()> {
    let dir = l.dir.join("pki");
    if dir.join("ca.crt").exists() {
        return top_up_pki(&dir);
    }
    std::fs::create_dir_all(&dir).map_err(Error::io(&dir))?;
    let ips: Vec<IpAddr> = vec![
        [127, 0, 0, 1].into(),
        KUBERNETES_SERVICE_IP.into(),
        ADVERTISE_ADDRESS.parse().expect("constant address"),
    ];
    let pki = ClusterPki::generate(&ips, time::OffsetDateTime::now_utc())?;
    // ca.crt last: its presence marks a complete PKI.
    let mut files = pki.files();
    files.sort_by_key(|(name, _)| name == "ca.crt");
    for (name, pem) in files {
        write_private(&dir.join(name), pem)?;
    }
    Ok(())
}

/// Issues, from the existing CA, the kubelet certificates a state directory made before they
/// existed lacks (the rest of its PKI, and what was signed with it, stays valid).
fn top_up_pki(dir: &Path) -> Result<()> {
    if dir.join("metrics-serving.crt").exists() {
        return Ok(());
    }
    let read = |n: &str| std::fs::read_to_string(dir.join(n)).map_err(Error::io(dir.join(n)));
    let ca = pki::Ca::load(&pki::CertKey {
        cert_pem: read("ca.crt")?,
        key_pem: read("ca.key")?,
    })?;
    let now = time::OffsetDateTime::now_utc();
    let issue = |spec: &pki::LeafSpec| ca.issue(spec, now, pki::LEAF_VALIDITY);
    let client = issue(&pki::LeafSpec::client(vcp_pki::KUBELET_CLIENT_USER, &[]))?;
    // Reissued even where it exists: older ones lack the tenant metrics name.
    let serving = issue(&pki::kubelet_serving_spec())?;
    let metrics = issue(&pki::metrics_serving_spec())?;
    for (name, pair) in [
        ("kubelet-client", &client),
        ("kubelet-serving", &serving),
        ("metrics-serving", &metrics),
    ] {
        write_private(&dir.join(format!("{name}.key")), &pair.key_pem)?;
        write_private(&dir.join(format!("{name}.crt")), &pair.cert_pem)?;
    }
    Ok(())
}

fn write_kubeconfig(
    l: &Layout,
    file: &str,
    server: &str,
    user: &str,
    cert: &str,
) -> Result<PathBuf> {
    let read = |name: &str| {
        let path = l.dir.join("pki").join(name);
        std::fs::read_to_string(&path).map_err(Error::io(&path))
    };
    let creds = pki::CertKey {
        cert_pem: read(&format!("{cert}.crt"))?,
        key_pem: read(&format!("{cert}.key"))?,
    };
    let yaml = kubeconfig::render("vcp-dev", server, &read("ca.crt")?, user, &creds);
    let path = l.file(file);
    write_private(&path, &yaml)?;
    Ok(path)
}

/// A kube client from a kubeconfig file.
pub async fn client_from(path: &Path) -> Result<Client> {
    let kc = kube::config::Kubeconfig::read_from(path)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Client::try_from(config).map_err(Error::kube("build a client"))
}

async fn boot(opts: Options) -> Result<DevCluster> {
    let t0 = Instant::now();
    if !(1..=16).contains(&opts.workers) {
        return Err(Error::InvalidOption(format!(
            "--workers must be 1 to 16, not {}",
            opts.workers
        )));
    }
    let dir = std::path::absolute(&opts.state_dir).map_err(Error::io(&opts.state_dir))?;
    std::fs::create_dir_all(&dir).map_err(Error::io(&dir))?;
    if let Some(c) = running_component(&dir) {
        return Err(Error::AlreadyRunning {
            dir,
            component: c.name,
            pid: c.pid,
        });
    }
    let version = bins::host_kubernetes_version();
    let etcd_bin = bins::tool("etcd")?;
    let kwok_bin = bins::tool("kwok")?;
    let metrics_server_bin = bins::tool("metrics-server")?;
    let apiserver_bin = bins::binary("kube-apiserver", version)?;
    let kcm_bin = bins::binary("kube-controller-manager", version)?;
    let scheduler_bin = bins::binary("kube-scheduler", version)?;
    let kubectl_bin = bins::binary("kubectl", version)?;
    let devnode_bin = devnode_binary()?;
    // Resolved here with the others, though it starts last.
    crate::s3::binary()?;

    let l = Layout { dir: dir.clone() };
    for sub in ["logs", "etcd", "volumes", "bin"] {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d).map_err(Error::io(&d))?;
    }
    ensure_pki(&l)?;
    link(&kubectl_bin, &dir.join("bin/kubectl"))?;
    if let Ok(helm) = bins::tool("helm") {
        link(&helm, &dir.join("bin/helm"))?;
    }
    let ca_pem = std::fs::read_to_string(dir.join("pki/ca.crt")).map_err(Error::io(&dir))?;
    let mode = opts.supervision;

    // Postgres boots while the control plane does; both are needed at the end.
    let (pg_dir, pg_log) = (dir.join("postgres"), l.log("postgres"));
    let pg = postgres::start_in(&pg_dir, &pg_log, mode);
    let cp = async {
        let [
            etcd_port,
            peer_port,
            api_port,
            kcm_port,
            sched_port,
            kwok_port,
            metrics_port,
        ] = process::free_ports()?;
        let mut procs: Vec<(Spawned, Option<u16>, Option<String>)> = Vec::new();

        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd = ProcSpec::new("etcd", &etcd_bin).args([
            "--name=vcp-dev".to_owned(),
            format!("--data-dir={}", p(&dir.join("etcd"))),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=vcp-dev={peer_url}"),
            // Disposable data: durability costs seconds per start and nothing is lost that matters.
            "--unsafe-no-fsync".to_owned(),
            "--log-level=warn".to_owned(),
        ]);
        let mut etcd = process::spawn(&etcd, mode, &l.log("etcd"))?;
        let etcd_health = format!("{etcd_url}/health");
        wait_healthy(&mut etcd, &etcd_health, &ca_pem).await?;
        procs.push((etcd, Some(etcd_port), Some(etcd_health)));

        let api_url = format!("https://127.0.0.1:{api_port}");
        let apiserver = ProcSpec::new("kube-apiserver", &apiserver_bin).args([
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--secure-port={api_port}"),
            format!("--advertise-address={ADVERTISE_ADDRESS}"),
            "--endpoint-reconciler-type=none".to_owned(),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            format!("--tls-cert-file={}", l.pki("apiserver.crt")),
            format!("--tls-private-key-file={}", l.pki("apiserver.key")),
            format!("--client-ca-file={}", l.pki("ca.crt")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
            format!("--service-account-key-file={}", l.pki("sa.pub")),
            format!("--service-account-signing-key-file={}", l.pki("sa.key")),
            "--authorization-mode=Node,RBAC".to_owned(),
            "--allow-privileged=true".to_owned(),
            format!(
                "--requestheader-client-ca-file={}",
                l.pki("front-proxy-ca.crt")
            ),
            "--requestheader-allowed-names=front-proxy-client".to_owned(),
            "--requestheader-username-headers=X-Remote-User".to_owned(),
            "--requestheader-group-headers=X-Remote-Group".to_owned(),
            "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_owned(),
            format!(
                "--proxy-client-cert-file={}",
                l.pki("front-proxy-client.crt")
            ),
            format!(
                "--proxy-client-key-file={}",
                l.pki("front-proxy-client.key")
            ),
            "--profiling=false".to_owned(),
            // Kubelet calls (logs, exec, attach, port-forward) reach kwok's kubelet API on the
            // loopback: simulated workers name it `localhost` (InternalDNS), which its
            // certificate names, verified as a kubelet's is.
            format!(
                "--kubelet-client-certificate={}",
                l.pki("kubelet-client.crt")
            ),
            format!("--kubelet-client-key={}", l.pki("kubelet-client.key")),
            format!("--kubelet-certificate-authority={}", l.pki("ca.crt")),
            "--kubelet-preferred-address-types=InternalDNS,InternalIP,Hostname".to_owned(),
        ]);
        let mut apiserver = process::spawn(&apiserver, mode, &l.log("kube-apiserver"))?;
        let api_health = format!("{api_url}/readyz");
        wait_healthy(&mut apiserver, &api_health, &ca_pem).await?;
        let apiserver_ready = t0.elapsed();
        procs.push((apiserver, Some(api_port), Some(api_health)));

        let admin_kc = write_kubeconfig(&l, "host.kubeconfig", &api_url, pki::ADMIN_USER, "admin")?;
        let kcm_kc = write_kubeconfig(
            &l,
            "controller-manager.kubeconfig",
            &api_url,
            "system:kube-controller-manager",
            "controller-manager",
        )?;
        let sched_kc = write_kubeconfig(
            &l,
            "scheduler.kubeconfig",
            &api_url,
            "system:kube-scheduler",
            "scheduler",
        )?;

        let kcm = ProcSpec::new("kube-controller-manager", &kcm_bin).args([
            format!("--kubeconfig={}", p(&kcm_kc)),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--secure-port={kcm_port}"),
            format!(
                "--tls-cert-file={}",
                l.pki("controller-manager-serving.crt")
            ),
            format!(
                "--tls-private-key-file={}",
                l.pki("controller-manager-serving.key")
            ),
            "--leader-elect=false".to_owned(),
            "--use-service-account-credentials=true".to_owned(),
            format!("--service-account-private-key-file={}", l.pki("sa.key")),
            format!("--root-ca-file={}", l.pki("ca.crt")),
            format!("--cluster-signing-cert-file={}", l.pki("ca.crt")),
            format!("--cluster-signing-key-file={}", l.pki("ca.key")),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            // The defaults (20/30) throttle a burst of hundreds of pods for no benefit here.
            "--kube-api-qps=200".to_owned(),
            "--kube-api-burst=400".to_owned(),
            "--profiling=false".to_owned(),
        ]);
        let sched_config = l.file("scheduler-config.yaml");
        write_atomic(
            &sched_config,
            &format!(
                "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n\
                 clientConnection:\n  kubeconfig: {}\n  qps: 200\n  burst: 400\n\
                 leaderElection:\n  leaderElect: false\n",
                p(&sched_kc)
            ),
        )?;
        let scheduler = ProcSpec::new("kube-scheduler", &scheduler_bin).args([
            format!("--config={}", p(&sched_config)),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--secure-port={sched_port}"),
            format!("--tls-cert-file={}", l.pki("scheduler-serving.crt")),
            format!("--tls-private-key-file={}", l.pki("scheduler-serving.key")),
            "--profiling=false".to_owned(),
        ]);
        let kwok_config = l.file("kwok.yaml");
        let kwok_dir = dir.join(crate::kwok::DIR);
        std::fs::create_dir_all(&kwok_dir).map_err(Error::io(&kwok_dir))?;
        write_atomic(
            &kwok_config,
            &format!(
                "{KWOK_STAGES}---\n{}---\n{}",
                crate::kwok::debugging(&kwok_dir)?,
                crate::kwok::metrics()
            ),
        )?;
        let kwok = ProcSpec::new("kwok", &kwok_bin).args([
            format!("--kubeconfig={}", p(&admin_kc)),
            format!("--config={}", p(&kwok_config)),
            "--manage-all-nodes=false".to_owned(),
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake".to_owned(),
            format!("--server-address=127.0.0.1:{kwok_port}"),
            format!("--tls-cert-file={}", l.pki("kubelet-serving.crt")),
            format!("--tls-private-key-file={}", l.pki("kubelet-serving.key")),
            "--node-lease-duration-seconds=40".to_owned(),
        ]);
        // The host's resource metrics (`kubectl top`, and what tenant syncers serve their
        // tenants): scraped from kwok at `localhost` (InternalDNS) and the port nodes publish,
        // verified as kubelets are, and aggregated by the host apiserver through an
        // ExternalName Service `localhost` (see `apply_cluster_objects`).
        let metrics_server = ProcSpec::new("metrics-server", &metrics_server_bin).args([
            format!("--kubeconfig={}", p(&admin_kc)),
            format!("--authentication-kubeconfig={}", p(&admin_kc)),
            format!("--authorization-kubeconfig={}", p(&admin_kc)),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--secure-port={metrics_port}"),
            format!("--tls-cert-file={}", l.pki("metrics-serving.crt")),
            format!("--tls-private-key-file={}", l.pki("metrics-serving.key")),
            format!("--kubelet-certificate-authority={}", l.pki("ca.crt")),
            format!(
                "--kubelet-client-certificate={}",
                l.pki("kubelet-client.crt")
            ),
            format!("--kubelet-client-key={}", l.pki("kubelet-client.key")),
            // kwok and the devnode publish `localhost`; the real node only its address.
            "--kubelet-preferred-address-types=InternalDNS,InternalIP".to_owned(),
            "--kubelet-use-node-status-port".to_owned(),
            // Its shortest: tests wait two periods for a pod's first figures.
            "--metric-resolution=10s".to_owned(),
            // Below the resolution, as metrics-server requires; kwok answers on the loopback.
            "--kubelet-request-timeout=5s".to_owned(),
        ]);
        let mut devnode = ProcSpec::new("devnode", &devnode_bin).args([
            format!("--kubeconfig={}", p(&admin_kc)),
            format!("--state-dir={}", p(&dir.join("devnode"))),
            format!("--node-name={DEVNODE_NAME}"),
            format!("--bin-dir={}", p(&bins::bin_dir())),
            // Its kubelet endpoint (`kubectl logs`) on a free port it publishes in its Node.
            format!("--tls-cert-file={}", l.pki("kubelet-serving.crt")),
            format!("--tls-private-key-file={}", l.pki("kubelet-serving.key")),
            format!("--client-ca-file={}", l.pki("ca.crt")),
        ]);
        // SIGTERM lets a devnode orphaned by its test process stop its pods and remove its
        // network; its containers still die with it (SIGKILL).
        devnode.parent_death_signal = "TERM";
        let mut kcm = process::spawn(&kcm, mode, &l.log("kube-controller-manager"))?;
        let mut scheduler = process::spawn(&scheduler, mode, &l.log("kube-scheduler"))?;
        let mut kwok = process::spawn(&kwok, mode, &l.log("kwok"))?;
        let mut metrics_server = process::spawn(&metrics_server, mode, &l.log("metrics-server"))?;
        let devnode = process::spawn(&devnode, mode, &l.log("devnode"))?;
        let client = client_from(&admin_kc).await?;
        let (real_node, real_node_host_ip, node_images) = if opts.real_node {
            let t = Instant::now();
            let (relay, proc, net) = start_real_node(&client, &dir, api_port, mode).await?;
            (Some([relay, proc]), Some(net.host_ip()), Some(t.elapsed()))
        } else {
            (None, None, None)
        };

        let provisioner = match mode {
            Supervision::Attached => (
                Some(Provisioner::start(admin_kc.clone(), dir.join("volumes"))?),
                None,
            ),
            Supervision::Detached => {
                let exe = std::env::current_exe().map_err(Error::io("/proc/self/exe"))?;
                let spec = ProcSpec::new("provisioner", exe)
                    .args(["provisioner".to_owned(), format!("--state-dir={}", p(&dir))]);
                (
                    None,
                    Some(process::spawn(&spec, mode, &l.log("provisioner"))?),
                )
            }
        };
        apply_cluster_objects(
            &client,
            opts.workers,
            version,
            kwok_port,
            metrics_port,
            &ca_pem,
        )
        .await?;

        let kcm_health = format!("https://127.0.0.1:{kcm_port}/healthz");
        let sched_health = format!("https://127.0.0.1:{sched_port}/healthz");
        let kwok_health = format!("http://127.0.0.1:{kwok_port}/healthz");
        wait_healthy(&mut kcm, &kcm_health, &ca_pem).await?;
        wait_healthy(&mut scheduler, &sched_health, &ca_pem).await?;
        wait_healthy(&mut kwok, &kwok_health, &ca_pem).await?;
        let metrics_health = format!("https://127.0.0.1:{metrics_port}/livez");
        wait_healthy(&mut metrics_server, &metrics_health, &ca_pem).await?;
        procs.push((kcm, Some(kcm_port), Some(kcm_health)));
        procs.push((scheduler, Some(sched_port), Some(sched_health)));
        procs.push((kwok, Some(kwok_port), Some(kwok_health)));
        procs.push((metrics_server, Some(metrics_port), Some(metrics_health)));
        procs.push((devnode, None, None));
        for n in real_node.into_iter().flatten() {
            procs.push((n, None, None));
        }
        if let Some(p) = provisioner.1 {
            procs.push((p, None, None));
        }
        if let Some(host_ip) = real_node_host_ip {
            apply_kubernetes_endpoints(&client, host_ip, crate::node::API_PORT).await?;
            apply_json(
                &client,
                &crate::node::network_policy_objects(&crate::images::network_policy_image()),
            )
            .await?;
            apply_json(
                &client,
                &crate::node::dns_objects(&crate::images::coredns_image()),
            )
            .await?;
        }
        wait_nodes_ready(&client, opts.workers, opts.real_node, &mut procs).await?;
        let nodes_ready = t0.elapsed();
        // The backup store, on the devnode's gateway (its network is claimed once its Node is
        // Ready), where pods and host processes both reach it.
        let index = crate::devnet::recorded(&dir.join("devnode"))
            .ok_or_else(|| Error::InvalidOption("the devnode recorded no network".into()))?;
        let (s3, s3_proc) = crate::s3::start_in(
            &dir.join("s3"),
            std::net::Ipv4Addr::new(10, 245, index, 1),
            &l.log("s3"),
            mode,
        )
        .await?;
        procs.push((s3_proc, None, None));
        Ok::<_, Error>((
            procs,
            s3,
            provisioner.0,
            client,
            api_url,
            admin_kc,
            apiserver_ready,
            nodes_ready,
            node_images,
        ))
    };
    let (pg, cp) = tokio::join!(pg, cp);
    let (
        mut procs,
        s3,
        provisioner,
        client,
        api_url,
        admin_kc,
        apiserver_ready,
        nodes_ready,
        node_images,
    ) = cp?;
    let pg = pg?;
    let database_url = pg.url.clone();
    procs.push((pg.proc, Some(pg.port), None));

    let state = State {
        kubernetes_version: version.to_owned(),
        apiserver_url: api_url,
        kubeconfig: admin_kc.clone(),
        database_url: database_url.clone(),
        service_cidr: SERVICE_CIDR.to_owned(),
        workers: opts.workers,
        s3: Some(s3),
        components: procs
            .iter()
            .map(|(s, port, health)| Component {
                name: s.name.clone(),
                pid: s.pid,
                exe: s.exe.clone(),
                port: *port,
                health: health.clone(),
                log: s.log.clone(),
            })
            .collect(),
    };
    write_state(&dir, &state)?;
    write_atomic(
        &dir.join("env"),
        &format!(
            "# Written by `vcp-dev up`; `source` it to use this dev cluster.\n\
             export VCP_DEV_STATE_DIR='{}'\nexport KUBECONFIG='{}'\nexport VCP_DATABASE_URL='{}'\n\
             export PATH='{}':\"$PATH\"\n",
            p(&dir),
            p(&admin_kc),
            database_url,
            p(&dir.join("bin"))
        ),
    )?;
    let procs = match mode {
        Supervision::Attached => procs.into_iter().map(|(s, _, _)| s).collect(),
        Supervision::Detached => {
            procs.into_iter().for_each(|(s, _, _)| s.release());
            Vec::new()
        }
    };
    Ok(DevCluster {
        state_dir: dir,
        state,
        client,
        procs,
        provisioner,
        timings: Timings {
            apiserver_ready,
            nodes_ready,
            total: t0.elapsed(),
            node_images,
        },
        _tmp: None,
    })
}

/// Claims a node network, writes the node's files, starts it and imports its images; on
/// failure, removes the network again.
async fn start_real_node(
    client: &Client,
    dir: &Path,
    api_port: u16,
    mode: Supervision,
) -> Result<(Spawned, Spawned, crate::node::NodeNet)> {
    let net = crate::node::NodeNet::claim()?;
    let layout = crate::node::Layout {
        dir: dir.join(crate::node::DIR),
    };
    let started = async {
        readdress_node(client, net.node_ip()).await?;
        layout.write(&net, &dir.join("pki"))?;
        let relay = crate::node::api_relay(&net, api_port)?;
        let relay = process::spawn(&relay, mode, &layout.dir.join("logs/api-relay.log"))?;
        let mut proc = crate::node::spawn(&layout, &net, mode)?;
        let n = crate::node::import_images(&layout, &net, &mut proc).await?;
        tracing::info!(
            images = n,
            node = crate::node::NODE_NAME,
            "real node started"
        );
        Ok::<_, Error>((relay, proc, net))
    }
    .await;
    if started.is_err() {
        net.sweep();
    }
    started
}

/// Gives the real node's Node object, if an earlier start of this state dir left one, the
/// address the node has now. The node's network index (and so its address) can differ from
/// the last start's; kube-proxy read the old address at start, then exited when the kubelet
/// changed it ("NodeIPs changed"), and that stopped the whole node (2026-11-29).
async fn readdress_node(client: &Client, ip: std::net::Ipv4Addr) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let name = crate::node::NODE_NAME;
    let found = nodes
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("get node {name}")))?;
    let Some(patch) = found.and_then(|n| node_readdress(&n, ip)) else {
        return Ok(());
    };
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::kube(format!("set node {name}'s address")))?;
    Ok(())
}

/// The status patch that gives `node` the internal address `ip`, if it names another one.
/// A merge patch replaces the whole address list, which the kubelet rewrites anyway.
fn node_readdress(node: &Node, ip: std::net::Ipv4Addr) -> Option<serde_json::Value> {
    let ip = ip.to_string();
    let addresses = node.status.as_ref()?.addresses.as_ref()?;
    let internal = addresses.iter().filter(|a| a.type_ == "InternalIP");
    if internal.clone().all(|a| a.address == ip) {
        return None;
    }
    let kept = addresses
        .iter()
        .filter(|a| a.type_ != "InternalIP")
        .map(|a| serde_json::json!({"type": a.type_, "address": a.address}));
    let list: Vec<serde_json::Value> =
        std::iter::once(serde_json::json!({"type": "InternalIP", "address": ip}))
            .chain(kept)
            .collect();
    Some(serde_json::json!({"status": {"addresses": list}}))
}

/// Server-side applies each object (`apiVersion`, `kind`, `metadata.name` and, when
/// namespaced, `metadata.namespace` set), discovering its resource.
async fn apply_json(client: &Client, objects: &[serde_json::Value]) -> Result<()> {
    let discovery = kube::Discovery::new(client.clone())
        .run()
        .await
        .map_err(Error::kube("discover the API"))?;
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    for obj in objects {
        let gvk = kube::core::GroupVersionKind::try_from(&kube::core::TypeMeta {
            api_version: obj["apiVersion"].as_str().unwrap_or_default().to_owned(),
            kind: obj["kind"].as_str().unwrap_or_default().to_owned(),
        })
        .map_err(|e| Error::Node(format!("object without a type: {e}")))?;
        let (ar, _) = discovery
            .resolve_gvk(&gvk)
            .ok_or_else(|| Error::Node(format!("the API serves no {gvk:?}")))?;
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let api: Api<kube::api::DynamicObject> = match obj["metadata"]["namespace"].as_str() {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
            None => Api::all_with(client.clone(), &ar),
        };
        api.patch(name, &pp, &Patch::Apply(obj))
            .await
            .map_err(Error::kube(format!("apply {} {name}", gvk.kind)))?;
    }
    Ok(())
}

/// The `kubernetes` Service's endpoints for the real node's pods, which reach the apiserver
/// through kube-proxy: the relay at the host's end of the node's link. The apiserver does not publish them
/// itself (`--endpoint-reconciler-type=none`: it advertises an address nothing dials).
async fn apply_kubernetes_endpoints(
    client: &Client,
    host_ip: std::net::Ipv4Addr,
    api_port: u16,
) -> Result<()> {
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let slice = serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "kubernetes-vcp-dev",
            "labels": {
                "kubernetes.io/service-name": "kubernetes",
                "endpointslice.kubernetes.io/managed-by": "vcp-dev",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [host_ip.to_string()], "conditions": {"ready": true}}],
        "ports": [{"name": "https", "port": api_port, "protocol": "TCP"}],
    });
    slices
        .patch(
            "kubernetes-vcp-dev",
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&slice),
        )
        .await
        .map_err(Error::kube("apply the kubernetes Service's endpoints"))?;
    Ok(())
}

/// The `vcp-devnode` binary: `$VCP_DEVNODE_BIN`, else next to this executable (or one level up,
/// for test binaries in `target/<profile>/deps`).
pub fn devnode_binary() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("VCP_DEVNODE_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(Error::io("/proc/self/exe"))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let candidates = [dir.join("vcp-devnode"), dir.join("../vcp-devnode")];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| Error::MissingBinary {
            component: "vcp-devnode".into(),
            version: "workspace".into(),
            path: candidates[0].clone(),
        })
}

fn link(target: &Path, at: &Path) -> Result<()> {
    let _ = std::fs::remove_file(at);
    std::os::unix::fs::symlink(target, at).map_err(Error::io(at))
}

/// The host's `metrics.k8s.io`, served by metrics-server on the loopback: an ExternalName
/// Service `localhost` (the aggregator dials an ExternalName as named, where it would dial a
/// ClusterIP, which is data here) and the APIService, verified with the cluster CA.
async fn apply_metrics_api(client: &Client, port: u16, ca_pem: &str) -> Result<()> {
    use base64::Engine as _;
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let svc = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "metrics-server", "namespace": "kube-system"},
        "spec": {"type": "ExternalName", "externalName": "localhost",
                 "ports": [{"name": "https", "port": port, "protocol": "TCP"}]},
    });
    Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), "kube-system")
        .patch("metrics-server", &pp, &Patch::Apply(&svc))
        .await
        .map_err(Error::kube("apply the metrics-server Service"))?;
    let gvk = kube::api::GroupVersionKind::gvk("apiregistration.k8s.io", "v1", "APIService");
    let ar = kube::api::ApiResource::from_gvk_with_plural(&gvk, "apiservices");
    let api_service = serde_json::json!({
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": "v1beta1.metrics.k8s.io"},
        "spec": {"group": "metrics.k8s.io", "version": "v1beta1",
                 "service": {"name": "metrics-server", "namespace": "kube-system", "port": port},
                 "caBundle": base64::engine::general_purpose::STANDARD.encode(ca_pem),
                 "groupPriorityMinimum": 100, "versionPriority": 100},
    });
    Api::<kube::api::DynamicObject>::all_with(client.clone(), &ar)
        .patch("v1beta1.metrics.k8s.io", &pp, &Patch::Apply(&api_service))
        .await
        .map_err(Error::kube("apply the metrics.k8s.io APIService"))?;
    Ok(())
}

/// Worker Nodes (for kwok) and the default StorageClass, applied server-side so a restart
/// re-applies them harmlessly.
async fn apply_cluster_objects(
    client: &Client,
    workers: u32,
    version: &str,
    kwok_port: u16,
    metrics_port: u16,
    ca_pem: &str,
) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    for i in 0..workers {
        let name = format!("kwok-node-{i}");
        let node = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    KWOK_NODE_LABEL.0: KWOK_NODE_LABEL.1,
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "node-role.kubernetes.io/worker": "",
                },
                "annotations": {
                    "kwok.x-k8s.io/node": "fake",
                    "node.alpha.kubernetes.io/ttl": "0",
                    // metrics-server reads this node's figures where kwok serves them.
                    "metrics.k8s.io/resource-metrics-path": crate::kwok::resource_metrics_path(&name),
                },
            },
            // kwok hands out pod IPs from the node's podCIDR, so IPs are unique cluster-wide; a
            // /20 per node (up to 16 nodes in 10.244.0.0/16) leaves room for benchmarks.
            "spec": {"podCIDR": pod_cidr(i), "podCIDRs": [pod_cidr(i)]},
        });
        nodes
            .patch(&name, &pp, &Patch::Apply(&node))
            .await
            .map_err(Error::kube(format!("apply node {name}")))?;
        let capacity = serde_json::json!({"cpu": "256", "memory": "1Ti", "pods": "4000"});
        let status = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "status": {
                // Simulated addresses: data for the API, never dialled. The kubelet API is
                // kwok's, at `localhost` (the host apiserver prefers InternalDNS).
                "addresses": [
                    {"type": "InternalDNS", "address": "localhost"},
                    {"type": "InternalIP", "address": format!("10.250.0.{}", i + 1)},
                    {"type": "Hostname", "address": name},
                ],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": kwok_port}},
                "capacity": capacity,
                "allocatable": capacity,
                "nodeInfo": {"kubeletVersion": version, "architecture": "amd64", "operatingSystem": "linux",
                    "bootID": "", "containerRuntimeVersion": "", "kernelVersion": "", "kubeProxyVersion": "",
                    "machineID": "", "osImage": "", "systemUUID": ""},
            },
        });
        nodes
            .patch_status(&name, &pp, &Patch::Apply(&status))
            .await
            .map_err(Error::kube(format!("apply status of node {name}")))?;
    }
    apply_metrics_api(client, metrics_port, ca_pem).await?;
    // A real kubelet authorizes the apiserver's calls (logs, exec, port-forward) by
    // SubjectAccessReview, as a kubeadm cluster binds them; kwok asks nobody.
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    let kubelet_api = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "vcp-dev:apiserver-kubelet-api"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:kubelet-api-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": vcp_pki::KUBELET_CLIENT_USER}],
    });
    bindings
        .patch(
            "vcp-dev:apiserver-kubelet-api",
            &pp,
            &Patch::Apply(&kubelet_api),
        )
        .await
        .map_err(Error::kube("bind the kubelet API to the apiserver"))?;
    let classes: Api<StorageClass> = Api::all(client.clone());
    let sc = serde_json::json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": STORAGE_CLASS,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": provisioner::PROVISIONER_NAME,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    });
    classes
        .patch(STORAGE_CLASS, &pp, &Patch::Apply(&sc))
        .await
        .map_err(Error::kube("apply the default storage class"))?;
    // The runtime class the conformance suite expects a node to offer (its "preconfigured"
    // handler; the real node runs it with runc): tenants of the conformance plan reach it by
    // handler, whatever they name their own class.
    let runtime: Api<RuntimeClass> = Api::all(client.clone());
    let rc = serde_json::json!({
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": TEST_RUNTIME_HANDLER},
        "handler": TEST_RUNTIME_HANDLER,
    });
    runtime
        .patch(TEST_RUNTIME_HANDLER, &pp, &Patch::Apply(&rc))
        .await
        .map_err(Error::kube("apply the test-handler runtime class"))?;
    Ok(())
}

/// The runtime handler the conformance suite names (`e2eruntimeclass.PreconfiguredRuntimeClassHandler`),
/// and the host RuntimeClass of that name and handler every dev cluster has.
pub const TEST_RUNTIME_HANDLER: &str = "test-handler";

/// Pod CIDR of kwok worker `i`: `10.244.<16 i>.0/20`.
pub fn pod_cidr(i: u32) -> String {
    format!("10.244.{}.0/20", i * 16)
}

/// Whether a Node's Ready condition is True.
pub fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn wait_nodes_ready(
    client: &Client,
    workers: u32,
    real_node: bool,
    procs: &mut [(Spawned, Option<u16>, Option<String>)],
) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let lp = ListParams::default().labels(&format!("{}={}", KWOK_NODE_LABEL.0, KWOK_NODE_LABEL.1));
    let started = Instant::now();
    loop {
        for (p, _, _) in procs.iter_mut() {
            p.check_running()?;
        }
        let list = nodes.list(&lp).await.map_err(Error::kube("list nodes"))?;
        let devnode = nodes
            .get_opt(DEVNODE_NAME)
            .await
            .map_err(Error::kube("get the devnode"))?;
        let real = if real_node {
            nodes
                .get_opt(crate::node::NODE_NAME)
                .await
                .map_err(Error::kube("get the real node"))?
                .as_ref()
                .is_some_and(node_ready)
        } else {
            true
        };
        if list.items.iter().filter(|n| node_ready(n)).count() >= workers as usize
            && devnode.as_ref().is_some_and(node_ready)
            && real
        {
            return Ok(());
        }
        if started.elapsed() > STARTUP_TIMEOUT {
            return Err(Error::Timeout {
                what: format!("{workers} kwok nodes and {DEVNODE_NAME} becoming Ready"),
                secs: STARTUP_TIMEOUT.as_secs(),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_left_with_another_address_is_readdressed_and_one_with_its_own_is_not() {
        let node = |ip: &str| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "vcp-node-0"},
                "status": {"addresses": [
                    {"type": "InternalIP", "address": ip},
                    {"type": "Hostname", "address": "vcp-node-0"},
                ]},
            }))
            .unwrap()
        };
        let now: std::net::Ipv4Addr = "10.243.0.2".parse().unwrap();
        assert_eq!(node_readdress(&node("10.243.0.2"), now), None);
        assert_eq!(
            node_readdress(&node("10.243.4.2"), now),
            Some(serde_json::json!({"status": {"addresses": [
                {"type": "InternalIP", "address": "10.243.0.2"},
                {"type": "Hostname", "address": "vcp-node-0"},
            ]}}))
        );
        // A node with no status yet: nothing to correct.
        let bare: Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n"}})).unwrap();
        assert_eq!(node_readdress(&bare, now), None);
    }

    #[test]
    fn pem_bundle_decodes_every_certificate() {
        let now = time::OffsetDateTime::now_utc();
        let a = pki::Ca::generate("a", now, pki::CA_VALIDITY).unwrap();
        let b = pki::Ca::generate("b", now, pki::CA_VALIDITY).unwrap();
        let bundle = format!("{}{}", a.cert_key().cert_pem, b.cert_key().cert_pem);
        let ders = pem_certs_der(&bundle);
        assert_eq!(ders.len(), 2);
        assert_eq!(ders[0][0], 0x30, "DER starts with a SEQUENCE");
    }

    #[test]
    fn down_on_a_dir_that_never_ran_is_a_no_op() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(down(dir.path()).unwrap(), 0);
        assert!(matches!(read_state(dir.path()), Err(Error::NoState(_))));
    }
}
