//! vcp-gateway: one TCP port for every tenant's apiserver, routed by the TLS server name.
//!
//! Data flow: a client dials `<tenant>.<domain>` on the gateway's port. [`proxy`] reads the
//! first bytes of the connection, [`sni`] finds the server name in the ClientHello without
//! terminating TLS, [`route`] turns `<tenant>.<domain>` into a tenant name and looks up its
//! backend, and [`proxy`] splices the connection (the bytes already read first) to that
//! tenant's apiserver Service. TLS runs end to end between the client and the apiserver: the
//! gateway holds no key and no certificate. [`table`] keeps the route table in step with the
//! host cluster's Services labelled `vcp.dev/gateway-name`; [`metrics`] serves `/metrics`,
//! `/healthz` and `/readyz` (ready once the table is synced) on a second port.
//!
//! Sleep mode, the gateway's half: vcp puts an idle tenant to sleep (its control plane scaled
//! to zero) and annotates its Service `vcp.dev/asleep: "true"`, which [`table`] carries into
//! the route. A connection for an asleep tenant makes [`wake`] ask vcp to wake it
//! (`POST /v1/gateway/wake`, deduplicated per tenant) while [`proxy`] holds the connection and
//! dials until the apiserver accepts, then splices as usual: the client sees a slow first
//! connection, not a failure. [`activity`] tells vcp which tenants had connections
//! (`POST /v1/gateway/activity`, every `--activity-interval-ms`), which is what keeps a tenant
//! in use awake. [`vcp`] is the HTTP client of both calls; without `--vcp-url` neither is made.
//!
//! [`sni`] and [`route`] are pure (bytes and names in, verdicts out), and so are the report
//! builder of [`activity`] and the deduplication of [`wake`]; [`proxy`] takes any
//! [`route::RouteTable`], so tests drive the real proxy with a table filled by hand, and a
//! stand-in for vcp on loopback.

pub mod activity;
pub mod metrics;
pub mod proxy;
pub mod route;
pub mod sni;
pub mod table;
pub mod vcp;
pub mod wake;

use clap::Parser;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use vcp_telemetry::LogFormat;

/// Errors of the gateway.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid domain {domain:?}: {reason}")]
    Domain {
        domain: String,
        reason: &'static str,
    },
    #[error("failed to listen on {addr}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to load kubeconfig {path}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("failed to find the in-cluster configuration")]
    InCluster(#[source] kube::config::InferConfigError),
    #[error("failed to build a kube client")]
    Client(#[source] kube::Error),
    #[error("invalid vcp token: must be printable ASCII without spaces, and not empty")]
    Token,
    #[error("failed to build the http client for vcp")]
    HttpClient(#[source] reqwest::Error),
    #[error("failed to call vcp's {call}")]
    VcpCall {
        call: &'static str,
        #[source]
        source: reqwest::Error,
    },
    #[error("vcp refused the gateway's token on {call} ({status})")]
    VcpToken { call: &'static str, status: u16 },
    #[error("vcp answered {status} to {call}")]
    VcpStatus { call: &'static str, status: u16 },
}

/// Result with the gateway's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The log level when `RUST_LOG` is unset: warnings, and the gateway's own info.
pub const DEFAULT_LOG_LEVEL: &str = "warn,vcp_gateway=info";

/// Command line of `vcp-gateway`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "vcp-gateway",
    version,
    about = "Routes TLS connections to tenant apiservers by server name, without terminating TLS"
)]
pub struct Args {
    /// Address of the TLS port every tenant apiserver is reached on.
    #[arg(long, env = "VCP_GATEWAY_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: String,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(
        long,
        env = "VCP_GATEWAY_METRICS_LISTEN",
        default_value = "0.0.0.0:9090"
    )]
    pub metrics_listen: String,
    /// The domain tenants are served under: `<tenant>.<domain>` reaches the tenant's apiserver.
    #[arg(long, env = "VCP_GATEWAY_DOMAIN", value_parser = parse_domain)]
    pub domain: route::Domain,
    /// Milliseconds a client has, from connecting, to send its whole ClientHello.
    #[arg(long, env = "VCP_GATEWAY_HANDSHAKE_TIMEOUT_MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub handshake_timeout_ms: u64,
    /// Milliseconds to wait for a tenant apiserver to accept a connection.
    #[arg(long, env = "VCP_GATEWAY_CONNECT_TIMEOUT_MS", default_value_t = 3000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub connect_timeout_ms: u64,
    /// Connections open at once; more are closed as they arrive.
    #[arg(long, env = "VCP_GATEWAY_MAX_CONNECTIONS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,
    /// Milliseconds open connections may go on after SIGTERM before the process exits (keep
    /// it under the pod's termination grace period).
    #[arg(long, env = "VCP_GATEWAY_DRAIN_TIMEOUT_MS", default_value_t = 20_000)]
    pub drain_timeout_ms: u64,
    /// Milliseconds a connection for an asleep tenant is held, once its ClientHello is read,
    /// while the tenant wakes and its apiserver starts.
    #[arg(long, env = "VCP_GATEWAY_WAKE_TIMEOUT_MS", default_value_t = 30_000,
          value_parser = clap::value_parser!(u64).range(1000..=120_000))]
    pub wake_timeout_ms: u64,
    /// vcp's API (`http://vcp.vcp-system.svc:8080`): where activity reports and wakes of
    /// asleep tenants go. Without it the gateway neither reports nor wakes: connections for an
    /// asleep tenant wait for its apiserver until the wake timeout, then fail.
    #[arg(long, env = "VCP_GATEWAY_VCP_URL", value_parser = parse_vcp_url, requires = "vcp_token")]
    pub vcp_url: Option<vcp::VcpUrl>,
    /// The gateway's bearer token for vcp's API; required with --vcp-url.
    #[arg(long, env = "VCP_GATEWAY_VCP_TOKEN", hide_env_values = true, value_parser = parse_token)]
    pub vcp_token: Option<vcp::Token>,
    /// Milliseconds between activity reports to vcp (each names the tenants that had a
    /// connection open since the last).
    #[arg(long, env = "VCP_GATEWAY_ACTIVITY_INTERVAL_MS", default_value_t = 30_000,
          value_parser = clap::value_parser!(u64).range(1000..=600_000))]
    pub activity_interval_ms: u64,
    /// Kubeconfig of the host cluster; the in-cluster configuration if absent.
    #[arg(long, env = "VCP_GATEWAY_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Log format: `text` for people, `json` (one object a line) for log collectors.
    #[arg(long, env = "VCP_GATEWAY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

fn parse_domain(s: &str) -> Result<route::Domain, String> {
    route::Domain::new(s).map_err(|e| e.to_string())
}

fn parse_vcp_url(s: &str) -> Result<vcp::VcpUrl, String> {
    vcp::VcpUrl::new(s)
}

/// Takes any value: clap would print a refused one in its error, and a token, even a wrong
/// one, must not reach a terminal or a log. [`Args::vcp`] checks it.
fn parse_token(s: &str) -> Result<vcp::Token, std::convert::Infallible> {
    Ok(vcp::Token::unchecked(s))
}

impl Args {
    /// The proxy's limits from the flags.
    pub fn limits(&self) -> proxy::Limits {
        proxy::Limits {
            handshake_timeout: Duration::from_millis(self.handshake_timeout_ms),
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            max_connections: self.max_connections,
            drain_timeout: Duration::from_millis(self.drain_timeout_ms),
            wake_timeout: Duration::from_millis(self.wake_timeout_ms),
        }
    }

    /// The client of vcp's API, if `--vcp-url` is set.
    pub fn vcp(&self) -> Result<Option<vcp::Vcp>> {
        let Some(url) = &self.vcp_url else {
            return Ok(None);
        };
        // clap's `requires` makes the token present with the URL.
        let token = self.vcp_token.clone().ok_or(Error::Token)?;
        vcp::Vcp::new(url.clone(), token).map(Some)
    }

    /// Time between activity reports.
    pub fn activity_interval(&self) -> Duration {
        Duration::from_millis(self.activity_interval_ms)
    }
}

/// A client of the host cluster: from `--kubeconfig`, or inferred (in-cluster in a pod).
async fn host_client(kubeconfig: Option<&std::path::Path>) -> Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let err = |source| Error::Kubeconfig {
                path: path.to_owned(),
                source,
            };
            let kc = kube::config::Kubeconfig::read_from(path).map_err(err)?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(err)?
        }
        None => kube::Config::infer().await.map_err(Error::InCluster)?,
    };
    kube::Client::try_from(config).map_err(Error::Client)
}

async fn listen(addr: &str) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Listen {
            addr: addr.to_owned(),
            source,
        })
}

/// Resolves on SIGTERM (a rollout, a deleted pod) or Ctrl-C.
async fn terminated() {
    use tokio::signal::unix::{SignalKind, signal};
    let term = async {
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = term => {}
        r = tokio::signal::ctrl_c() => {
            if r.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Runs the gateway until SIGTERM, then drains open connections for `--drain-timeout-ms`.
pub async fn run(args: Args) -> Result<()> {
    let limits = args.limits();
    let vcp = args.vcp()?;
    let client = host_client(args.kubeconfig.as_deref()).await?;
    let listener = listen(&args.listen).await?;
    let metrics_listener = listen(&args.metrics_listen).await?;
    let routes = Arc::new(route::RouteTable::new());
    let mut gateway = proxy::Gateway::new(args.domain.clone(), routes.clone(), limits);
    if let Some(vcp) = &vcp {
        gateway = gateway.with_vcp(vcp.clone());
    }
    let gateway = Arc::new(gateway);
    tracing::info!(listen = %args.listen, metrics = %args.metrics_listen, domain = %args.domain, "starting");
    match vcp {
        Some(vcp) => {
            tracing::info!(vcp = %vcp.url(), interval_ms = args.activity_interval_ms, "reporting activity to vcp and waking asleep tenants");
            tokio::spawn(activity::run(
                vcp,
                gateway.activity.clone(),
                gateway.metrics.clone(),
                args.activity_interval(),
            ));
        }
        None => tracing::warn!(
            "no --vcp-url: activity is not reported and asleep tenants are not woken"
        ),
    }

    // Unready once stopping, so the Service stops sending connections here while open ones
    // drain.
    let stopping = Arc::new(AtomicBool::new(false));
    let ready = {
        let (routes, stopping) = (routes.clone(), stopping.clone());
        move || routes.is_synced() && !stopping.load(Ordering::Acquire)
    };
    let router = metrics::router(gateway.metrics.clone(), ready);
    tokio::spawn(async move {
        if let Err(error) = axum::serve(metrics_listener, router).await {
            tracing::error!(%error, "metrics endpoint stopped");
        }
    });

    // What the gateway keeps per tenant goes with the tenant's route.
    let forget = {
        let (metrics, activity) = (gateway.metrics.clone(), gateway.activity.clone());
        let wakes = gateway.wakes.clone();
        move |tenant: &route::TenantKey| {
            metrics.forget_tenant(tenant.as_str());
            activity.forget(tenant.as_str());
            wakes.forget(tenant.as_str());
        }
    };
    tokio::spawn(table::run(client, routes, forget));

    let shutdown = async move {
        terminated().await;
        tracing::info!("stopping");
        stopping.store(true, Ordering::Release);
    };
    gateway.serve(listener, shutdown).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(["vcp-gateway"].iter().chain(extra))
    }

    #[test]
    fn the_defaults_are_the_documented_ones() {
        let args = parse(&["--domain=Example.Test"]).unwrap();
        assert_eq!(args.listen, "0.0.0.0:8443");
        assert_eq!(args.metrics_listen, "0.0.0.0:9090");
        assert_eq!(args.domain.as_str(), "example.test");
        let limits = args.limits();
        assert_eq!(limits.handshake_timeout, Duration::from_secs(5));
        assert_eq!(limits.connect_timeout, Duration::from_secs(3));
        assert_eq!(limits.max_connections, 10_000);
        assert_eq!(limits.wake_timeout, Duration::from_secs(30));
        assert_eq!(args.activity_interval(), Duration::from_secs(30));
        assert!(args.vcp_url.is_none());
        assert!(args.vcp().unwrap().is_none(), "no vcp, no sleep mode");
    }

    #[test]
    fn the_vcp_url_needs_a_token_which_is_never_shown() {
        let url = "--vcp-url=http://vcp.vcp-system.svc:8080/";
        let refused = parse(&["--domain=x.test", url]).unwrap_err();
        assert_eq!(
            refused.kind(),
            clap::error::ErrorKind::MissingRequiredArgument
        );
        let args = parse(&["--domain=x.test", url, "--vcp-token=t0ken"]).unwrap();
        let vcp = args.vcp().unwrap().expect("a client");
        assert_eq!(vcp.url().as_str(), "http://vcp.vcp-system.svc:8080");
        assert!(!format!("{args:?}").contains("t0ken"));
        assert!(!format!("{vcp:?}").contains("t0ken"));
        // A bad token is refused after parsing, without its value.
        let bad = parse(&["--domain=x.test", url, "--vcp-token=s3cret token"]).unwrap();
        let refused = bad.vcp().unwrap_err().to_string();
        assert!(refused.contains("invalid vcp token") && !refused.contains("s3cret"));
        assert!(parse(&["--domain=x.test", "--vcp-url=ftp://vcp", "--vcp-token=t"]).is_err());
    }

    #[test]
    fn the_sleep_mode_timings_are_bounded() {
        for ok in ["--wake-timeout-ms=1000", "--wake-timeout-ms=120000"] {
            assert!(parse(&["--domain=x.test", ok]).is_ok(), "{ok}");
        }
        for bad in [
            "--wake-timeout-ms=999",
            "--wake-timeout-ms=120001",
            "--activity-interval-ms=999",
            "--activity-interval-ms=600001",
        ] {
            assert!(parse(&["--domain=x.test", bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_domain_is_required_and_checked() {
        assert!(parse(&[]).is_err());
        let refused = parse(&["--domain=a..b"]).unwrap_err();
        assert!(refused.to_string().contains("invalid domain"), "{refused}");
        assert!(parse(&["--domain=x.test", "--handshake-timeout-ms=0"]).is_err());
        assert!(parse(&["--domain=x.test", "--max-connections=0"]).is_err());
    }
}
