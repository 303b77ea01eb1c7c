//! vcp-syncer: makes a tenant's workloads real on the host cluster.
//!
//! Data flow: [`run`] starts, per kind, kube-runtime controllers that watch the tenant
//! apiserver and the host apiserver (host side filtered by this tenant's label, per host
//! namespace), one watch and one cache per kind and side shared by every controller that reads
//! it ([`engine::shared`]). For each kind, a down-controller reconciles tenant objects into
//! host objects, and a gc-controller removes host objects whose tenant object is gone
//! ([`engine`], generic over kinds). Pods also flow up: status, binding to virtual nodes, and
//! graceful deletion both ways. All state lives in the two apiservers, so a restart converges
//! from scratch.
//!
//! Layout:
//! - [`kinds`]: each kind in one place, `kinds/<kind>/translate.rs` (pure: tenant object ->
//!   host object, host status -> tenant patch) beside `kinds/<kind>/mod.rs` (its sync). A
//!   tenant pod becomes a host pod in `kinds/pods/translate.rs` (`to_host`), driven by
//!   `kinds/pods/mod.rs` (`down`).
//! - [`engine`]: what every kind shares: the watch-decide-write loop, the caches, the
//!   tenant-wide quota.
//! - `vcp_core::naming` (keys, host names, markers) and `vcp_policy` (what the tenant's plan
//!   allows) are the pure rules both; [`naming`] holds the names of objects only the syncer
//!   makes.
//! - [`kubelet`]: the kubelet endpoint the tenant apiserver calls for `kubectl logs`, `exec`,
//!   `attach` and `port-forward`, passed on to the host pod's subresources.
//! - [`revocation`]: the revocation authorizer (`vcp-syncer authorize`), not part of the sync:
//!   a sidecar in the tenant apiserver's pod that refuses revoked kubeconfigs. It ships in
//!   this binary because it shares the syncer's image and its host plumbing.
//! - [`top`]: the tenant's `metrics.k8s.io` (`kubectl top`), served on the kubelet endpoint
//!   from the host's pod metrics.
//! - [`egress`]: the tenant apiserver's egress proxy, served on the kubelet endpoint, which
//!   lets it dial only the tenant's own pods and Services and the syncer itself.
//! - [`metrics`] counts what is served on `/metrics`.
//! - [`etc_hosts`]: `vcp-syncer etc-hosts`, the init container the syncer puts in host pods
//!   with a `subdomain`, which spells the pod's own name in its `/etc/hosts` as the tenant
//!   does. Also not part of the sync; it ships here for the same reason.

pub mod answer;
pub mod egress;
pub mod engine;
pub mod etc_hosts;
pub mod kinds;
pub mod kubelet;
pub mod metrics;
pub mod naming;
pub mod revocation;
pub mod tenant;
pub mod top;

use clap::Parser;
use k8s_openapi::api::core::v1::Service;
use kube::Client;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use vcp_telemetry::LogFormat;

/// Errors of the syncer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to {context}")]
    Kube {
        context: String,
        #[source]
        source: kube::Error,
    },
    #[error("failed to load kubeconfig {path}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("failed to build a client from the in-cluster configuration")]
    InCluster(#[source] kube::Error),
    #[error(transparent)]
    InvalidKey(#[from] vcp_core::Error),
    #[error("cannot issue a service-account token: {0}")]
    Token(String),
    #[error("{0} is not ready yet")]
    NotReady(String),
    #[error("failed to read the tenant policy {path}")]
    PolicyFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Policy {
        path: PathBuf,
        #[source]
        source: vcp_policy::Error,
    },
    #[error("kubelet endpoint: {0}")]
    Kubelet(String),
    #[error("egress relay: {0}")]
    Relay(String),
    #[error("failed to serve the egress relay on {path}")]
    RelaySocket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to {what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to serve health endpoints on {addr}")]
    Serve {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// The variant's name, as metrics label failures.
    pub fn variant(&self) -> &'static str {
        match self {
            Error::Kube { .. } => "kube",
            Error::Kubeconfig { .. } => "kubeconfig",
            Error::InCluster(_) => "in_cluster",
            Error::InvalidKey(_) => "invalid_key",
            Error::Token(_) => "token",
            Error::NotReady(_) => "not_ready",
            Error::PolicyFile { .. } | Error::Policy { .. } => "policy",
            Error::Serve { .. } => "serve",
            Error::Io { .. } => "io",
            Error::Kubelet(_) => "kubelet",
            Error::Relay(_) | Error::RelaySocket { .. } => "relay",
        }
    }
}

pub use vcp_core::chain;

/// Wraps a kube error with what the syncer was doing, for `map_err`:
/// `.map_err(kube_err(format!("get host secret {ns}/{name}")))`.
pub(crate) fn kube_err(context: String) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Kube { context, source }
}

/// Result with the syncer's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Command line of `vcp-syncer`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "vcp-syncer",
    version,
    about = "Syncs a tenant's workloads onto the host cluster \
             (`vcp-syncer authorize --help`: the revocation authorizer; \
             `vcp-syncer etc-hosts --help`: the hosts-file init container)",
    // The last occurrence of a flag wins, so a wrapper's defaults can be overridden by
    // appending (the test harness passes its own --listen).
    args_override_self = true
)]
pub struct Args {
    /// Kubeconfig of the tenant apiserver.
    #[arg(long, env = "VCP_TENANT_KUBECONFIG")]
    pub tenant_kubeconfig: PathBuf,
    /// Kubeconfig of the host apiserver; in-cluster configuration if absent.
    #[arg(long, env = "VCP_HOST_KUBECONFIG")]
    pub host_kubeconfig: Option<PathBuf>,
    /// The tenant's immutable key: host namespaces are `<key>-<namespace>`.
    #[arg(long, env = "VCP_TENANT_KEY")]
    pub tenant_key: String,
    /// The tenant's control-plane namespace on the host (its apiserver and DNS Services).
    #[arg(long, env = "VCP_HOST_NAMESPACE")]
    pub host_namespace: Option<String>,
    /// The ClusterRole with the syncer's namespaced permissions, which it binds to its own
    /// service account in each host namespace it creates (its only access to objects there).
    /// Without it no binding is written, and the host credentials must reach the tenant's
    /// namespaces by themselves (a host admin's, in tests).
    #[arg(long, env = "VCP_SYNCER_HOST_ROLE", requires = "host_namespace")]
    pub host_role: Option<String>,
    /// The syncer's service account in the control-plane namespace, the subject of those
    /// bindings.
    #[arg(
        long,
        env = "VCP_SYNCER_HOST_SERVICE_ACCOUNT",
        default_value = "vcp-syncer"
    )]
    pub host_service_account: String,
    /// Name of the tenant apiserver's Service in the control-plane namespace.
    #[arg(long, env = "VCP_APISERVER_SERVICE", default_value = "kube-apiserver")]
    pub apiserver_service: String,
    /// Name of the tenant CoreDNS Service in the control-plane namespace.
    #[arg(long, env = "VCP_DNS_SERVICE", default_value = "kube-dns")]
    pub dns_service: String,
    /// The tenant's cluster domain.
    #[arg(long, env = "VCP_CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Image of the init container that spells a pod's own name in its `/etc/hosts` with the
    /// tenant's namespace (the syncer's own image, which runs `vcp-syncer etc-hosts`); without
    /// it host pods keep the kubelet's name, whose namespace is the host's.
    #[arg(long, env = "VCP_ETC_HOSTS_IMAGE")]
    pub etc_hosts_image: Option<String>,
    /// Sync every ConfigMap and Secret, not only those tenant pods reference.
    #[arg(long, env = "VCP_SYNC_ALL_CONFIGMAPS_SECRETS")]
    pub sync_all_configmaps_secrets: bool,
    /// Concurrent reconciles per kind.
    #[arg(long, env = "VCP_SYNC_WORKERS", default_value_t = 8)]
    pub workers: u16,
    /// Threads of the async runtime. One (the default) runs everything on one thread: the
    /// cheapest per event, since nothing is handed between threads (about 10 % less CPU on
    /// the pod pass than two, docs/benchmarks.md), and one core is far more than a tenant's
    /// syncer uses. More spread the reconciles over cores.
    #[arg(long, env = "VCP_SYNCER_THREADS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub threads: u16,
    /// Seconds between full resyncs: every synced object is reconciled again after this long,
    /// which repairs drift that no watch event reported.
    #[arg(long, env = "VCP_SYNCER_RESYNC_SECONDS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub resync_seconds: u64,
    /// Seconds between virtual-node status refreshes.
    #[arg(long, env = "VCP_NODE_SYNC_SECONDS", default_value_t = 10)]
    pub node_sync_seconds: u64,
    /// The tenant policy (YAML, the `policy` section of the tenant's plan); without it, the
    /// restrictive defaults.
    #[arg(long, env = "VCP_SYNCER_POLICY")]
    pub policy: Option<PathBuf>,
    /// Address of /healthz, /readyz and (without `--metrics-listen`) /metrics.
    #[arg(long, env = "VCP_SYNCER_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Address of /metrics when it must not be served beside the probes on `--listen` (which
    /// the kubelet reaches on the pod's IP): vcp binds it to loopback, so only a scraper in
    /// the pod's network namespace reads it.
    #[arg(long, env = "VCP_SYNCER_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Address of the kubelet endpoint the tenant apiserver calls for logs, exec, attach and
    /// port-forward (see docs/syncer.md); without it there is none, and virtual nodes carry
    /// the host node's internal addresses.
    #[arg(long, env = "VCP_KUBELET_LISTEN", requires_all = ["kubelet_tls_cert", "kubelet_tls_key", "kubelet_client_ca"])]
    pub kubelet_listen: Option<String>,
    /// The host name or IP address virtual nodes give for the endpoint (the syncer's Service
    /// name, which its serving certificate names); by default the listen address's host.
    #[arg(long, env = "VCP_KUBELET_ADDRESS", requires = "kubelet_listen")]
    pub kubelet_address: Option<String>,
    /// The port virtual nodes give for the endpoint (a Service's port); by default the port it
    /// listens on.
    #[arg(long, env = "VCP_KUBELET_PORT", requires = "kubelet_listen")]
    pub kubelet_port: Option<u16>,
    /// The endpoint's serving certificate (PEM).
    #[arg(long, env = "VCP_KUBELET_TLS_CERT")]
    pub kubelet_tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, env = "VCP_KUBELET_TLS_KEY")]
    pub kubelet_tls_key: Option<PathBuf>,
    /// The CA client certificates must be signed by: the tenant CA.
    #[arg(long, env = "VCP_KUBELET_CLIENT_CA")]
    pub kubelet_client_ca: Option<PathBuf>,
    /// The only client certificate common name admitted: the tenant apiserver's kubelet client.
    #[arg(long, env = "VCP_KUBELET_CLIENT_NAME", default_value = kubelet::APISERVER_CLIENT)]
    pub kubelet_client_name: String,
    /// The CA of the tenant apiserver's front-proxy client certificate. With it, the kubelet
    /// endpoint also serves the tenant's `metrics.k8s.io` (`kubectl top`) from the host's,
    /// and the syncer registers that API in the tenant (see docs/syncer.md).
    #[arg(long, env = "VCP_METRICS_API_CLIENT_CA", requires = "kubelet_listen")]
    pub metrics_api_client_ca: Option<PathBuf>,
    /// The only front-proxy client certificate common name the metrics API admits.
    #[arg(long, env = "VCP_METRICS_API_CLIENT_NAME", default_value = top::DEFAULT_CLIENT)]
    pub metrics_api_client_name: String,
    /// What tenant pods' service-account tokens must be issued under: an opaque value vcp
    /// changes when the tenant's signing key or CA changes (a rotation). A host token Secret
    /// recorded under another value is reissued at once instead of at 80% of its lifetime, so
    /// no pod holds a token of a key about to be retired.
    #[arg(long, env = "VCP_TOKEN_GENERATION", default_value = "")]
    pub token_generation: String,
    /// The CA bundle tenant pods get as `ca.crt` beside their token, read at each issue; by
    /// default the tenant's `kube-root-ca.crt`. vcp gives the file its own trust bundle, which
    /// holds the old and the new CA while the tenant CA rotates.
    #[arg(long, env = "VCP_TOKEN_CA")]
    pub token_ca: Option<PathBuf>,
    /// Log format: `text` for people, `json` (one object a line) for log collectors.
    #[arg(long, env = "VCP_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// The log level when `RUST_LOG` is unset: warnings, and the syncer's own info.
pub const DEFAULT_LOG_LEVEL: &str = "warn,vcp_syncer=info";

/// What the binary runs: the syncer, or with the first argument `authorize` the revocation
/// authorizer ([`revocation::authorizer`]), or with `etc-hosts` the hosts-file init container
/// ([`etc_hosts`]). Not clap subcommands: the syncer's own flags are required at the top
/// level, and a subcommand beside them would make every one optional.
#[derive(Debug, Clone)]
pub enum Command {
    Sync(Box<Args>),
    Authorize(Box<revocation::authorizer::Args>),
    EtcHosts(etc_hosts::Args),
}

impl Command {
    /// Parses the command line (program name first), exiting with clap's message on an error.
    pub fn parse_from<I, T>(args: I) -> Command
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        Self::try_parse_from(args).unwrap_or_else(|e| e.exit())
    }

    /// [`Command::parse_from`] without exiting.
    pub fn try_parse_from<I, T>(args: I) -> Result<Command, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let mut args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
        if args.get(1).is_some_and(|a| a == "authorize") {
            args.remove(1);
            revocation::authorizer::Args::try_parse_from(args)
                .map(|a| Command::Authorize(Box::new(a)))
        } else if args.get(1).is_some_and(|a| a == "etc-hosts") {
            args.remove(1);
            etc_hosts::Args::try_parse_from(args).map(Command::EtcHosts)
        } else {
            Args::try_parse_from(args).map(|a| Command::Sync(Box::new(a)))
        }
    }

    /// The async runtime the command runs on: for the syncer, as many threads as `--threads`
    /// (one: a current-thread runtime); the authorizer and `etc-hosts` keep tokio's default.
    pub fn runtime(&self) -> std::io::Result<tokio::runtime::Runtime> {
        let mut builder = match self {
            Command::Sync(args) if args.threads == 1 => {
                tokio::runtime::Builder::new_current_thread()
            }
            Command::Sync(args) => {
                let mut b = tokio::runtime::Builder::new_multi_thread();
                b.worker_threads(usize::from(args.threads));
                b
            }
            Command::Authorize(_) | Command::EtcHosts(_) => {
                tokio::runtime::Builder::new_multi_thread()
            }
        };
        builder.enable_all().build()
    }

    /// Sets up logging and runs the command until the process is stopped.
    pub async fn run(self) -> Result<()> {
        match self {
            Command::Sync(args) => {
                vcp_telemetry::init(args.log_format, DEFAULT_LOG_LEVEL);
                run(*args).await
            }
            Command::Authorize(args) => {
                vcp_telemetry::init(args.log_format, DEFAULT_LOG_LEVEL);
                revocation::authorizer::run(*args).await
            }
            // One file, no logging set up: it prints what it did, which the pod's log keeps.
            Command::EtcHosts(args) => etc_hosts::run(args),
        }
    }
}

pub(crate) async fn config_from(path: &std::path::Path) -> Result<kube::Config> {
    let err = |source| Error::Kubeconfig {
        path: path.to_owned(),
        source,
    };
    let kc = kube::config::Kubeconfig::read_from(path).map_err(err)?;
    kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(err)
}

/// A client whose requests are counted on `/metrics`.
fn counted_client(cfg: kube::Config, requests: metrics::ApiRequests) -> Result<Client> {
    let builder =
        kube::client::ClientBuilder::try_from(cfg).map_err(kube_err("build a client".into()))?;
    Ok(builder.with_layer(&requests.layer()).build())
}

/// Finds the tenant apiserver and DNS Services in the control-plane namespace.
async fn pod_env(host: &Client, args: &Args) -> tenant::PodEnv {
    let mut env = tenant::PodEnv {
        cluster_domain: args.cluster_domain.clone(),
        etc_hosts_image: args.etc_hosts_image.clone().filter(|i| !i.is_empty()),
        ..Default::default()
    };
    let Some(ns) = &args.host_namespace else {
        return env;
    };
    let api: kube::Api<Service> = kube::Api::namespaced(host.clone(), ns);
    let ip_port = |s: &Service| {
        let spec = s.spec.as_ref()?;
        Some((spec.cluster_ip.clone()?, spec.ports.as_ref()?.first()?.port))
    };
    if let Ok(Some(s)) = api.get_opt(&args.apiserver_service).await {
        env.apiserver = ip_port(&s);
    }
    if let Ok(Some(s)) = api.get_opt(&args.dns_service).await {
        env.dns = ip_port(&s).map(|(ip, _)| ip);
    }
    env
}

/// The tenant policy from `--policy`, or the defaults.
pub fn load_policy(path: Option<&std::path::Path>) -> Result<vcp_policy::TenantPolicy> {
    let Some(path) = path else {
        return Ok(vcp_policy::TenantPolicy::default());
    };
    let text = std::fs::read_to_string(path).map_err(|source| Error::PolicyFile {
        path: path.to_owned(),
        source,
    })?;
    vcp_policy::TenantPolicy::from_yaml(&text).map_err(|source| Error::Policy {
        path: path.to_owned(),
        source,
    })
}

/// Runs the syncer until the process is stopped.
pub async fn run(args: Args) -> Result<()> {
    let key = vcp_core::naming::TenantKey::new(&args.tenant_key)?;
    // A policy that does not parse stops the syncer before it writes anything to the host.
    let policy = load_policy(args.policy.as_deref())?;
    let metrics = metrics::Metrics::new();
    let tenant = counted_client(
        config_from(&args.tenant_kubeconfig).await?,
        metrics.api_requests("tenant"),
    )?;
    let host_cfg = match &args.host_kubeconfig {
        Some(p) => config_from(p).await?,
        None => kube::Config::infer()
            .await
            .map_err(|e| Error::InCluster(kube::Error::InferConfig(e)))?,
    };
    // The kubelet endpoint's calls stream for as long as a `logs -f` or a shell lasts.
    let mut stream_cfg = host_cfg.clone();
    stream_cfg.read_timeout = None;
    stream_cfg.write_timeout = None;
    let host = counted_client(host_cfg, metrics.api_requests("host"))?;
    let env = pod_env(&host, &args).await;
    tracing::info!(tenant = %key, apiserver = ?env.apiserver, dns = ?env.dns, pod_security = %policy.pod_security, "starting");
    let mut engine = engine::Engine::new(tenant, host, key.clone(), policy, env);
    engine.metrics = metrics;
    engine.sync_all_configmaps_secrets = args.sync_all_configmaps_secrets;
    engine.resync = Duration::from_secs(args.resync_seconds);
    engine.control_plane_namespace = args.host_namespace.clone();
    let mut pods = kinds::pods::PodCtx {
        tokens: kinds::pods::tokens::TokenSource {
            generation: args.token_generation.clone(),
            ca_file: args.token_ca.clone(),
        },
        ..Default::default()
    };
    let host_access = args
        .host_role
        .clone()
        .zip(args.host_namespace.clone())
        .map(|(role, ns)| kinds::namespaces::access::HostAccess {
            role,
            service_account: (ns, args.host_service_account.clone()),
        });
    let kubelet = match &args.kubelet_listen {
        Some(listen) => {
            let files = kubelet::TlsFiles {
                cert: args.kubelet_tls_cert.clone().unwrap_or_default(),
                key: args.kubelet_tls_key.clone().unwrap_or_default(),
                client_ca: args.kubelet_client_ca.clone().unwrap_or_default(),
                metrics_client_ca: args.metrics_api_client_ca.clone(),
            };
            let (tls, authorities) = kubelet::tls_config(&files)?;
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .map_err(|source| Error::Serve {
                    addr: listen.clone(),
                    source,
                })?;
            let bound = listener.local_addr().map_err(|source| Error::Serve {
                addr: listen.clone(),
                source,
            })?;
            let endpoint = kinds::pods::nodes::KubeletEndpoint {
                address: args
                    .kubelet_address
                    .clone()
                    .unwrap_or_else(|| bound.ip().to_string()),
                port: args.kubelet_port.unwrap_or(bound.port()),
            };
            tracing::info!(listen = %bound, address = %endpoint.address, port = endpoint.port, metrics_api = args.metrics_api_client_ca.is_some(), "kubelet endpoint");
            pods.kubelet_endpoint = Some(endpoint);
            let client = kube::client::ClientBuilder::try_from(stream_cfg)
                .map_err(kube_err("build a client".into()))?
                .build();
            Some((listener, tls, authorities, client, bound))
        }
        None => None,
    };
    let engine = Arc::new(engine);
    let pods = Arc::new(pods);
    // The endpoint's APIService names its serving certificate's CA: the tenant CA, which also
    // signs the kubelet client it admits.
    let metrics_ca = match (&args.metrics_api_client_ca, &args.kubelet_client_ca) {
        (Some(_), Some(ca)) => {
            Some(std::fs::read(ca).map_err(|e| Error::Kubelet(format!("{}: {e}", ca.display())))?)
        }
        _ => None,
    };
    let (stop_tx, stopping) = tokio::sync::watch::channel(false);
    let kubelet = kubelet.map(|(listener, tls, authorities, client, bound)| {
        let own = pods
            .kubelet_endpoint
            .clone()
            .map(|e| (e.address, e.port))
            .unwrap_or_default();
        // Dialled from here: an unspecified bind address is answered on loopback.
        let own_listen = if bound.ip().is_unspecified() {
            std::net::SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), bound.port())
        } else {
            bound
        };
        let egress = Some(Arc::new(egress::Proxy {
            engine: engine.clone(),
            addresses: pods.addresses.clone(),
            own,
            own_listen,
            cluster_domain: args.cluster_domain.clone(),
        }));
        let metrics = metrics_ca.is_some().then(|| {
            (
                Arc::new(top::MetricsApi {
                    engine: engine.clone(),
                }),
                args.metrics_api_client_name.clone(),
            )
        });
        (
            listener,
            tls,
            Arc::new(kubelet::Endpoint {
                key: key.clone(),
                host: client,
                client_name: args.kubelet_client_name.clone(),
                authorities,
                stopping: stopping.clone(),
                metrics,
                egress,
            }),
        )
    });
    let registration = {
        let e = engine.clone();
        let endpoint = pods.kubelet_endpoint.clone();
        let period = Duration::from_secs(args.resync_seconds);
        async move {
            let (Some(ca), Some(at)) = (metrics_ca, endpoint) else {
                return;
            };
            // Again every resync period: a tenant admin who deletes the APIService gets it back.
            loop {
                let wait = match top::register(&e.tenant, &at.address, at.port, &ca).await {
                    Ok(()) => period,
                    Err(err) => {
                        tracing::warn!(error = %chain(&err), "registering metrics.k8s.io in the tenant failed; retrying");
                        Duration::from_secs(5)
                    }
                };
                tokio::time::sleep(wait).await;
            }
        }
    };
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|source| Error::Serve {
            addr: args.listen.clone(),
            source,
        })?;
    let w = args.workers;
    let metrics = engine.clone();
    let metrics_route = axum::routing::get(move || async move {
        (
            [(
                axum::http::header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            metrics.metrics.encode(),
        )
    });
    let mut health = axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .route("/readyz", axum::routing::get(|| async { "ok" }));
    // With an address of its own, /metrics is served there only (see `--metrics-listen`).
    let metrics_server = match &args.metrics_listen {
        Some(addr) => {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| Error::Serve {
                    addr: addr.clone(),
                    source,
                })?;
            Some((l, axum::Router::new().route("/metrics", metrics_route)))
        }
        None => {
            health = health.route("/metrics", metrics_route);
            None
        }
    };
    let everything = async move {
        tokio::join!(
            kinds::run(kinds::Start {
                engine: engine.clone(),
                workers: w,
                period: Duration::from_secs(args.node_sync_seconds.max(1)),
                pods,
                host_access,
            }),
            engine::spawned(engine::quota::usage(
                engine.clone(),
                Duration::from_secs(args.node_sync_seconds.max(1))
            )),
            engine::spawned(registration),
            async move {
                if let Some((listener, tls, endpoint)) = kubelet {
                    kubelet::serve(listener, tls, endpoint).await;
                }
            },
            async move {
                if let Err(e) = axum::serve(listener, health).await {
                    tracing::error!(error = %e, "health and metrics endpoints stopped");
                }
            },
            async move {
                if let Some((l, router)) = metrics_server
                    && let Err(e) = axum::serve(l, router).await
                {
                    tracing::error!(error = %e, "metrics endpoint stopped");
                }
            },
        )
    };
    // SIGTERM (a rollout, a deleted pod): open log streams end with a note saying why, rather
    // than as if the container had stopped logging. Everything else simply stops: all state is
    // in the two apiservers.
    let terminated = async move {
        let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        else {
            return std::future::pending().await;
        };
        term.recv().await;
        tracing::info!("stopping");
        let _ = stop_tx.send(true);
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    tokio::select! {
        _ = everything => {}
        () = terminated => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &[&str]) -> Result<Args, clap::Error> {
        let base = ["vcp-syncer", "--tenant-kubeconfig=/t", "--tenant-key=demo"];
        Args::try_parse_from(base.iter().chain(extra))
    }

    #[test]
    fn the_syncer_runs_on_one_thread_unless_told_otherwise() {
        use tokio::runtime::RuntimeFlavor;
        let flavor = |extra: &[&str]| {
            let args = parse(extra).expect("parses");
            Command::Sync(Box::new(args))
                .runtime()
                .expect("a runtime")
                .handle()
                .runtime_flavor()
        };
        assert_eq!(flavor(&[]), RuntimeFlavor::CurrentThread);
        assert_eq!(flavor(&["--threads=2"]), RuntimeFlavor::MultiThread);
        let refused = parse(&["--threads=0"]).expect_err("no threads is refused");
        assert!(refused.to_string().contains("--threads"), "{refused}");
    }

    #[test]
    fn the_resync_period_defaults_to_five_minutes_and_is_configurable() {
        assert_eq!(parse(&[]).unwrap().resync_seconds, 300);
        assert_eq!(
            parse(&["--resync-seconds", "30"]).unwrap().resync_seconds,
            30
        );
        assert!(
            parse(&["--resync-seconds", "0"]).is_err(),
            "a zero period would requeue in a hot loop"
        );
    }

    #[test]
    fn a_policy_file_is_read_and_checked_and_its_absence_means_the_defaults() {
        assert_eq!(
            load_policy(None).unwrap(),
            vcp_policy::TenantPolicy::default()
        );
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.yaml");
        std::fs::write(&good, "pod_security: restricted\n").unwrap();
        assert_eq!(
            load_policy(Some(&good)).unwrap().pod_security,
            vcp_policy::Level::Restricted
        );
        let bad = dir.path().join("bad.yaml");
        std::fs::write(&bad, "pod_security: lax\n").unwrap();
        let err = load_policy(Some(&bad)).unwrap_err().to_string();
        assert!(err.contains("bad.yaml") && err.contains("lax"), "{err}");
        assert!(matches!(
            load_policy(Some(&dir.path().join("missing.yaml"))),
            Err(Error::PolicyFile { .. })
        ));
    }

    #[test]
    fn logs_are_text_unless_json_is_asked_for() {
        assert_eq!(parse(&[]).unwrap().log_format, LogFormat::Text);
        assert_eq!(
            parse(&["--log-format", "json"]).unwrap().log_format,
            LogFormat::Json
        );
        assert!(parse(&["--log-format", "yaml"]).is_err());
    }

    #[test]
    fn authorize_as_the_first_argument_runs_the_revocation_authorizer() {
        let cmd = Command::try_parse_from([
            "vcp-syncer",
            "authorize",
            "--revocations-file=/etc/vcp/revocations/serials",
        ])
        .unwrap();
        let Command::Authorize(a) = cmd else {
            panic!("{cmd:?}")
        };
        assert_eq!(a.listen, vcp_core::revocation::AUTHORIZER_LISTEN);
        assert_eq!(a.host_namespace, None);
        assert_eq!(a.drain_seconds, 15);
        // The authorizer needs its list; the syncer's flags are not its own.
        assert!(Command::try_parse_from(["vcp-syncer", "authorize"]).is_err());
        assert!(
            Command::try_parse_from([
                "vcp-syncer",
                "authorize",
                "--revocations-file=/f",
                "--tenant-key=demo"
            ])
            .is_err()
        );
        // Anything else is the syncer, as before.
        let cmd =
            Command::try_parse_from(["vcp-syncer", "--tenant-kubeconfig=/t", "--tenant-key=demo"])
                .unwrap();
        assert!(matches!(cmd, Command::Sync(a) if a.tenant_key == "demo"));
    }

    #[test]
    fn the_authorizers_egress_socket_comes_with_the_proxy_and_its_files() {
        let parse = |extra: &[&str]| {
            let mut args = vec!["vcp-syncer", "authorize", "--revocations-file=/f"];
            args.extend_from_slice(extra);
            Command::try_parse_from(args)
        };
        let full = [
            "--egress-socket=/run/vcp-egress/controlplane.sock",
            "--egress-proxy=https://vcp-syncer.vcp-t1.svc:10250",
            "--egress-ca=/ca.crt",
            "--egress-client-cert=/tls.crt",
            "--egress-client-key=/tls.key",
        ];
        let Command::Authorize(a) = parse(&full).unwrap() else {
            panic!("not the authorizer")
        };
        assert_eq!(
            a.egress_socket.as_deref(),
            Some(std::path::Path::new("/run/vcp-egress/controlplane.sock"))
        );
        // Without the socket, no relay and none of its flags.
        let Command::Authorize(a) = parse(&[]).unwrap() else {
            panic!("not the authorizer")
        };
        assert_eq!(a.egress_socket, None);
        // Each flag alone is incomplete.
        for i in 0..full.len() {
            let mut partial = full.to_vec();
            partial.remove(i);
            assert!(parse(&partial).is_err(), "without {}", full[i]);
        }
    }

    #[test]
    fn a_repeated_flag_takes_the_last_value() {
        let args = parse(&["--listen=127.0.0.1:1", "--listen=127.0.0.1:2"]).unwrap();
        assert_eq!(args.listen, "127.0.0.1:2");
    }
}
