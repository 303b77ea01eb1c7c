//! `vcp-syncer authorize`: the revocation authorizer, a sidecar in the tenant apiserver's pod.
//!
//! Data flow: [`run`] follows the revoked serials from the mounted ConfigMap
//! ([`super::follow_file`]) and, with `--host-namespace`, from a watch on the host
//! ([`super::follow`]); [`super::merge`] publishes their union, which the webhook on `--listen`
//! (the pod's loopback, where only the apiserver beside it calls) answers from
//! ([`super::review`]). `/healthz` and `/readyz` on `--health-listen` are the kubelet's
//! probes: ready once a list has been read, so an apiserver pod takes no traffic before its
//! authorizer can answer.
//!
//! With `--egress-socket` it also serves the apiserver's control-plane egress on a Unix socket
//! shared with it ([`crate::egress::relay`]): the apiserver dials this webhook and every
//! webhook given by URL through that socket; the webhook stays in the pod, everything else is
//! asked of the syncer's egress proxy.
//!
//! It lives and dies with the apiserver: the same pod, started and rolled with it. On SIGTERM
//! it keeps answering for `--drain-seconds`, because the apiserver beside it keeps serving
//! through its own shutdown delay, and every revocable request it takes then needs an answer.

use super::{Revoked, channel, follow, follow_file, merge, review};
use crate::egress::relay::{ChainTls, Relay};
use crate::{Error, Result};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use vcp_telemetry::LogFormat;

/// Command line of `vcp-syncer authorize`.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "vcp-syncer authorize",
    version,
    about = "Refuses revoked kubeconfigs: the tenant apiserver's authorization webhook, \
             run beside it in its pod",
    args_override_self = true
)]
pub struct Args {
    /// Address of the webhook (`POST /vcp/authorize`, plain HTTP): the loopback of the
    /// apiserver's pod, which only the pod's own containers reach.
    #[arg(long, env = "VCP_AUTHORIZER_LISTEN", default_value = vcp_core::revocation::AUTHORIZER_LISTEN)]
    pub listen: String,
    /// Address of `/healthz` and `/readyz` for the kubelet's probes (the pod IP); they tell
    /// only whether a list has been read. Without it, none are served.
    #[arg(long, env = "VCP_AUTHORIZER_HEALTH_LISTEN")]
    pub health_listen: Option<String>,
    /// The revoked serials, one a line: the `serials` key of the host ConfigMap
    /// `vcp-revocations`, mounted as a volume. Read every second.
    #[arg(long, env = "VCP_REVOCATIONS_FILE")]
    pub revocations_file: PathBuf,
    /// The tenant's control-plane namespace on the host. With it, the same ConfigMap is also
    /// watched there, which sees a revocation in about a second where a kubelet refreshes the
    /// volume only on its pod sync (a minute or more).
    #[arg(long, env = "VCP_HOST_NAMESPACE")]
    pub host_namespace: Option<String>,
    /// Kubeconfig of the host apiserver for that watch; in-cluster configuration if absent.
    #[arg(long, env = "VCP_HOST_KUBECONFIG", requires = "host_namespace")]
    pub host_kubeconfig: Option<PathBuf>,
    /// Seconds it keeps answering after SIGTERM: the apiserver beside it serves through its
    /// `--shutdown-delay-duration` and finishes what it accepted, and needs answers until then.
    #[arg(long, env = "VCP_AUTHORIZER_DRAIN_SECONDS", default_value_t = 15)]
    pub drain_seconds: u64,
    /// A Unix socket on which to serve the apiserver's control-plane egress (HTTP CONNECT, its
    /// egress selection `controlplane` over `uds`), on a volume the apiserver shares: this
    /// webhook is dialled locally, every other target through the syncer's egress proxy.
    #[arg(
        long,
        env = "VCP_AUTHORIZER_EGRESS_SOCKET",
        requires_all = ["egress_proxy", "egress_ca", "egress_client_cert", "egress_client_key"]
    )]
    pub egress_socket: Option<PathBuf>,
    /// The syncer's egress proxy, `https://vcp-syncer.<namespace>.svc:10250` (its kubelet
    /// endpoint), as the apiserver's `cluster` selection names it.
    #[arg(long, env = "VCP_AUTHORIZER_EGRESS_PROXY", requires = "egress_socket")]
    pub egress_proxy: Option<String>,
    /// The CA the proxy's serving certificate is verified with (the tenant CA).
    #[arg(long, env = "VCP_AUTHORIZER_EGRESS_CA", requires = "egress_socket")]
    pub egress_ca: Option<PathBuf>,
    /// The client certificate presented to the proxy: the apiserver's kubelet client
    /// certificate, the only one it serves.
    #[arg(
        long,
        env = "VCP_AUTHORIZER_EGRESS_CLIENT_CERT",
        requires = "egress_socket"
    )]
    pub egress_client_cert: Option<PathBuf>,
    /// That certificate's key.
    #[arg(
        long,
        env = "VCP_AUTHORIZER_EGRESS_CLIENT_KEY",
        requires = "egress_socket"
    )]
    pub egress_client_key: Option<PathBuf>,
    /// vcp's audit ingest as `host:port`, the target of the apiserver's audit webhook: the
    /// relay dials exactly this target from the pod rather than through the syncer, which
    /// allows only the tenant's own addresses.
    #[arg(long, env = "VCP_AUTHORIZER_AUDIT_INGEST", requires = "egress_socket")]
    pub audit_ingest: Option<String>,
    /// Log format: `text` for people, `json` (one object a line) for log collectors.
    #[arg(long, env = "VCP_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

async fn authorize(State(revoked): State<Revoked>, body: Bytes) -> Response {
    let current = revoked.borrow().clone();
    let (status, value) = review(&body, current.as_deref());
    (status, axum::Json(value)).into_response()
}

async fn readyz(State(revoked): State<Revoked>) -> (StatusCode, &'static str) {
    if revoked.borrow().is_some() {
        (StatusCode::OK, "ok")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the revoked kubeconfigs are not read yet",
        )
    }
}

async fn bind(addr: &str) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Serve {
            addr: addr.to_owned(),
            source,
        })
}

/// Serves `app` on `listener` until the process ends.
async fn serve(listener: tokio::net::TcpListener, app: axum::Router, what: &'static str) {
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, what, "the authorizer stopped serving");
    }
}

/// Runs the authorizer until SIGTERM and its drain period are over.
pub async fn run(args: Args) -> Result<()> {
    let (file_tx, file_rx) = channel();
    let mut sources = vec![file_rx];
    let watch = match &args.host_namespace {
        Some(ns) => {
            let cfg = match &args.host_kubeconfig {
                Some(p) => crate::config_from(p).await?,
                None => kube::Config::infer()
                    .await
                    .map_err(|e| Error::InCluster(kube::Error::InferConfig(e)))?,
            };
            let host = kube::Client::try_from(cfg)
                .map_err(crate::kube_err("build a host client".into()))?;
            let (tx, rx) = channel();
            sources.push(rx);
            Some(follow(host, ns.clone(), tx))
        }
        None => None,
    };
    let (tx, revoked) = channel();
    let webhook = axum::Router::new()
        .route(
            vcp_core::revocation::WEBHOOK_PATH,
            axum::routing::post(authorize),
        )
        .layer(DefaultBodyLimit::max(super::MAX_REVIEW))
        .with_state(revoked.clone());
    let listener = bind(&args.listen).await?;
    let relay = match &args.egress_socket {
        Some(socket) => {
            let listen = listener.local_addr().map_err(|source| Error::Serve {
                addr: args.listen.clone(),
                source,
            })?;
            // All four are required with the socket (clap's `requires_all`).
            let missing = || Error::Relay("--egress-socket needs the proxy and its files".into());
            let tls = ChainTls {
                ca: args.egress_ca.as_deref().ok_or_else(missing)?,
                cert: args.egress_client_cert.as_deref().ok_or_else(missing)?,
                key: args.egress_client_key.as_deref().ok_or_else(missing)?,
            };
            let proxy = args.egress_proxy.as_deref().ok_or_else(missing)?;
            let mut relay = Relay::new(listen, proxy, &tls)?;
            if let Some(ingest) = &args.audit_ingest {
                relay = relay.with_audit_ingest(ingest)?;
            }
            let relay = Arc::new(relay);
            tracing::info!(socket = %socket.display(), proxy, audit_ingest = ?args.audit_ingest, "control-plane egress relay");
            Some((relay, crate::egress::relay::bind(socket)?))
        }
        None => None,
    };
    let health = match &args.health_listen {
        Some(addr) => Some((
            bind(addr).await?,
            axum::Router::new()
                .route("/healthz", axum::routing::get(|| async { "ok" }))
                .route("/readyz", axum::routing::get(readyz))
                .with_state(revoked),
        )),
        None => None,
    };
    tracing::info!(listen = %args.listen, health = ?args.health_listen, file = %args.revocations_file.display(), watch = ?args.host_namespace, "revocation authorizer");
    let everything = async move {
        tokio::join!(
            follow_file(args.revocations_file.clone(), file_tx),
            async move {
                if let Some(w) = watch {
                    w.await;
                }
            },
            merge(sources, tx),
            serve(listener, webhook, "webhook"),
            async move {
                if let Some((listener, app)) = health {
                    serve(listener, app, "health").await;
                }
            },
            async move {
                if let Some((relay, socket)) = relay {
                    relay.serve(socket).await;
                }
            },
        )
    };
    let drain = Duration::from_secs(args.drain_seconds);
    let terminated = async move {
        let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        else {
            return std::future::pending().await;
        };
        term.recv().await;
        tracing::info!(
            drain_seconds = drain.as_secs(),
            "stopping after the drain period"
        );
        tokio::time::sleep(drain).await;
    };
    tokio::select! {
        _ = everything => {}
        () = terminated => {}
    }
    Ok(())
}
