//! The tenant's kubelet endpoint: `kubectl logs`, `exec`, `attach`, `port-forward` and `cp`
//! inside a tenant.
//!
//! Data flow: a tenant's virtual nodes carry this endpoint's address and port instead of the
//! host node's ([`crate::kinds::pods::nodes`]), so the tenant apiserver sends its kubelet
//! calls here. [`serve`] accepts TLS connections and admits only a client certificate signed
//! by the tenant CA whose common name is the tenant apiserver's kubelet client; anything else
//! is refused at the handshake (no certificate, another CA) or with 403 (another name). Each
//! request is read by [`route::parse`] into a call on one tenant pod, the pod's host copy is
//! checked to carry this tenant's markers for that very pod (so no name, however crafted,
//! reaches another tenant's pod or one the syncer does not own), and the call is made on the
//! host apiserver as the pod's `log`, `exec`, `attach` or `portforward` subresource with the
//! syncer's host credentials. A streaming call (SPDY or WebSocket, whatever the tenant
//! apiserver speaks) is passed through byte for byte once the host answers `101 Switching
//! Protocols`; a log is streamed as its body. The host apiserver then reaches the host node's
//! kubelet as it would for any client, so this works on any host whose own `kubectl exec`
//! works, and with the host's authorization: the syncer's role grants these subresources in
//! its own host namespaces only.
//!
//! Nothing of a call's query (commands, say) is logged: it may hold what the tenant considers
//! secret.

pub mod route;
pub mod spdy;

use crate::answer::{Body, text};
use crate::{Error, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kube::ResourceExt;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tracing::Instrument;
use vcp_core::naming::{self, TenantKey};

/// The common name of the tenant apiserver's kubelet client certificate, the only client the
/// endpoint serves by default.
pub const APISERVER_CLIENT: &str = vcp_pki::KUBELET_CLIENT_USER;

/// Default port of the endpoint, the kubelet's own.
pub const DEFAULT_PORT: u16 = 10250;

/// Request headers passed on to the host: what the streaming protocols negotiate with.
const PASSED_HEADERS: [&str; 8] = [
    "connection",
    "upgrade",
    "x-stream-protocol-version",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-protocol",
    "sec-websocket-extensions",
    "content-type",
];

/// Where the endpoint's certificates are.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The endpoint's serving certificate (PEM, the chain).
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The CA a client certificate must be signed by: the tenant's.
    pub client_ca: PathBuf,
    /// The CA of the tenant apiserver's front-proxy client, which calls the metrics API
    /// ([`crate::top`]); without it, that API is not served.
    pub metrics_client_ca: Option<PathBuf>,
}

/// Which CA signed a client certificate, by the CA's subject: the endpoint tells the tenant
/// apiserver's kubelet client from its front-proxy client by their CAs, not only their names.
#[derive(Debug, Clone, Default)]
pub struct Authorities {
    /// Subjects (DER) of the tenant CA certificates.
    pub kubelet: Vec<Vec<u8>>,
    /// Subjects (DER) of the front-proxy CA certificates.
    pub metrics: Vec<Vec<u8>>,
}

/// Reads the CA certificates of `path` into `roots`, returning their subjects.
fn add_roots(roots: &mut rustls::RootCertStore, path: &Path) -> Result<Vec<Vec<u8>>> {
    let bad = |what: String| Error::Kubelet(format!("{}: {what}", path.display()));
    let mut subjects = Vec::new();
    for ca in CertificateDer::pem_file_iter(path).map_err(|e| bad(e.to_string()))? {
        let ca = ca.map_err(|e| bad(e.to_string()))?;
        let (_, parsed) =
            x509_parser::parse_x509_certificate(ca.as_ref()).map_err(|e| bad(e.to_string()))?;
        subjects.push(parsed.subject().as_raw().to_vec());
        roots.add(ca).map_err(|e| bad(e.to_string()))?;
    }
    if subjects.is_empty() {
        return Err(bad("no certificate".into()));
    }
    Ok(subjects)
}

/// The endpoint's TLS setup: its serving certificate, and client certificates required and
/// verified against the tenant CA (and the front-proxy CA, when the metrics API is served).
pub fn tls_config(files: &TlsFiles) -> Result<(Arc<rustls::ServerConfig>, Authorities)> {
    let bad = |path: &Path, what: String| Error::Kubelet(format!("{}: {what}", path.display()));
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|i| i.collect())
        .map_err(|e| bad(&files.cert, e.to_string()))?;
    let key =
        PrivateKeyDer::from_pem_file(&files.key).map_err(|e| bad(&files.key, e.to_string()))?;
    let mut roots = rustls::RootCertStore::empty();
    let mut authorities = Authorities {
        kubelet: add_roots(&mut roots, &files.client_ca)?,
        metrics: Vec::new(),
    };
    if let Some(ca) = &files.metrics_client_ca {
        authorities.metrics = add_roots(&mut roots, ca)?;
        // Told apart by subject: two CAs of one name would make a front-proxy certificate
        // pass for a kubelet client (or the reverse).
        if authorities
            .metrics
            .iter()
            .any(|s| authorities.kubelet.contains(s))
        {
            return Err(bad(
                ca,
                "the front-proxy CA has the tenant CA's subject; they must differ".into(),
            ));
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .map_err(|e| bad(&files.client_ca, e.to_string()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Kubelet(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| bad(&files.cert, e.to_string()))?;
    // HTTP/1.1 only: the streaming protocols are upgrades of an HTTP/1.1 request.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((Arc::new(config), authorities))
}

/// What a connection needs to serve calls.
pub struct Endpoint {
    pub key: TenantKey,
    /// Host client for the calls: no read or write timeout, a stream may be idle for long.
    pub host: kube::Client,
    /// The client certificate name admitted ([`APISERVER_CLIENT`]).
    pub client_name: String,
    /// Which CA signed a client certificate.
    pub authorities: Authorities,
    /// Becomes true when the syncer is stopping: open log streams end with [`STOP_NOTE`].
    pub stopping: tokio::sync::watch::Receiver<bool>,
    /// The metrics API and the front-proxy client name it admits
    /// ([`crate::top::DEFAULT_CLIENT`]), when served.
    pub metrics: Option<(Arc<crate::top::MetricsApi>, String)>,
    /// The tenant apiserver's egress proxy ([`crate::egress`]): its CONNECTs are judged there;
    /// without it, every CONNECT is refused.
    pub egress: Option<Arc<crate::egress::Proxy>>,
}

/// The last line of a log stream the syncer ends because it is stopping: without it a
/// `kubectl logs -f` would end as if the container had stopped logging.
pub const STOP_NOTE: &str = "\n[vcp] this log stream ended because the tenant's syncer is restarting; run the command again\n";

/// A host log body passed on until it ends, or until the syncer stops: then [`STOP_NOTE`] ends it.
fn ending_on_stop<B>(body: B, stopping: tokio::sync::watch::Receiver<bool>) -> Body
where
    B: hyper::body::Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = futures::stream::unfold(Some((body, stopping)), |state| async move {
        let (mut body, mut stopping) = state?;
        let frame = tokio::select! {
            frame = body.frame() => Some(frame),
            _ = stopping.wait_for(|s| *s) => None,
        };
        match frame {
            Some(Some(Ok(f))) => Some((Ok(f), Some((body, stopping)))),
            Some(Some(Err(e))) => Some((Err(e.into()), None)),
            Some(None) => None,
            None => Some((
                Ok(hyper::body::Frame::data(Bytes::from_static(
                    STOP_NOTE.as_bytes(),
                ))),
                None,
            )),
        }
    });
    http_body_util::StreamBody::new(stream).boxed_unsync()
}

/// Who a connection's client certificate says it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Client {
    /// The tenant apiserver's kubelet client: kubelet calls.
    Apiserver,
    /// The tenant apiserver's front-proxy client: metrics.k8s.io.
    Aggregator,
    /// Anyone else with a certificate of one of those CAs.
    Other,
}

impl Endpoint {
    /// Who presents `cert` (DER): the admitted name signed by the admitted CA, or no one.
    fn client(&self, cert: &[u8]) -> Client {
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(cert) else {
            return Client::Other;
        };
        let issuer = cert.issuer().as_raw();
        let cn = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|c| c.as_str().ok());
        if self.authorities.kubelet.iter().any(|s| s == issuer)
            && cn == Some(self.client_name.as_str())
        {
            return Client::Apiserver;
        }
        if let Some((_, name)) = &self.metrics
            && self.authorities.metrics.iter().any(|s| s == issuer)
            && cn == Some(name.as_str())
        {
            return Client::Aggregator;
        }
        Client::Other
    }
}

/// Serves the endpoint on `listener` until the future is dropped.
pub async fn serve(listener: TcpListener, tls: Arc<rustls::ServerConfig>, endpoint: Arc<Endpoint>) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "kubelet endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (acceptor, endpoint) = (acceptor.clone(), endpoint.clone());
        tokio::spawn(async move {
            let tls =
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        tracing::info!(%peer, error = %e, "kubelet endpoint: handshake refused");
                        return;
                    }
                    Err(_) => return,
                };
            let cert = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| c.as_ref().to_vec())
                .unwrap_or_default();
            let client = endpoint.client(&cert);
            if client == Client::Other {
                tracing::info!(%peer, name = ?common_name(&cert), "kubelet endpoint: client not admitted");
            }
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let endpoint = endpoint.clone();
                async move {
                    // The apiserver's egress (see crate::egress). Anyone else's CONNECT gets the
                    // proxy's one refusal too, so nothing tells the two apart.
                    if req.method() == hyper::Method::CONNECT {
                        let res = match (client, &endpoint.egress) {
                            (Client::Apiserver, Some(proxy)) => proxy.connect(req).await,
                            _ => crate::egress::refused(),
                        };
                        return Ok::<_, std::convert::Infallible>(res);
                    }
                    let metrics = req.uri().path().starts_with("/apis");
                    let res = match (client, &endpoint.metrics) {
                        (Client::Aggregator, Some((api, _))) if metrics => api.handle(req).await,
                        (Client::Apiserver, _) if !metrics => endpoint.handle(req).await,
                        (Client::Apiserver | Client::Aggregator, _) => {
                            text(StatusCode::FORBIDDEN, "this client may not call this path")
                        }
                        (Client::Other, _) => text(
                            StatusCode::FORBIDDEN,
                            "only the tenant apiserver may call this endpoint",
                        ),
                    };
                    Ok::<_, std::convert::Infallible>(res)
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .with_upgrades();
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "kubelet endpoint: connection ended");
            }
        });
    }
}

/// The subject common name of a DER certificate.
fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_owned)
}

fn header_str<B>(res: &Response<B>, name: &str) -> String {
    res.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// What an `exec` or `attach` stream cut by a stopping syncer reports to kubectl.
pub const STOP_STATUS: &str =
    "the stream ended because the tenant's syncer is restarting; run the command again";
/// What a stream whose host connection ended without the command's status reports.
pub const BROKEN_STATUS: &str =
    "the stream ended because the host connection broke before the command finished";

/// Returns once the syncer is stopping (the watch's guard is not held past it).
async fn stopped(stopping: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stopping.wait_for(|s| *s).await;
}

/// Passes an SPDY `exec` or `attach` stream on both ways, whole frames at a time towards the
/// tenant, and ends it with a status on its error stream when the syncer stops or (with
/// `host_says_status`: the protocol's server always ends with a status) when the host side
/// ends without one. Without that status the client would read an empty error stream as
/// success, and kubectl would exit 0 for a command that never finished.
async fn pump_spdy<T, H>(
    tenant: T,
    host: H,
    mut stopping: tokio::sync::watch::Receiver<bool>,
    host_says_status: bool,
) where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    H: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tracker = std::sync::Mutex::new(spdy::Tracker::default());
    let (mut tenant_r, mut tenant_w) = tokio::io::split(tenant);
    let (mut host_r, mut host_w) = tokio::io::split(host);
    let up = async {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match tenant_r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    tracker.lock().expect("not poisoned").client(&buf[..n]);
                    if host_w.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = host_w.shutdown().await;
    };
    let down = async {
        let mut buf = vec![0u8; 32 * 1024];
        let why = loop {
            tokio::select! {
                read = host_r.read(&mut buf) => match read {
                    Ok(0) | Err(_) => break host_says_status.then_some(BROKEN_STATUS),
                    Ok(n) => {
                        let whole = tracker.lock().expect("not poisoned").server(&buf[..n]);
                        if tenant_w.write_all(&whole).await.is_err() {
                            return;
                        }
                    }
                },
                () = stopped(&mut stopping) => break Some(STOP_STATUS),
            }
        };
        let ending = {
            let mut t = tracker.lock().expect("not poisoned");
            match why.and_then(|w| t.ending(w)) {
                Some(frame) => {
                    tracing::info!(reason = why, "kubelet stream ended with a status");
                    frame
                }
                None => t.held(),
            }
        };
        let _ = tenant_w.write_all(&ending).await;
        let _ = tenant_w.shutdown().await;
    };
    tokio::pin!(up, down);
    tokio::select! {
        () = &mut up => down.await,
        () = &mut down => {}
    }
}

impl Endpoint {
    /// Serves one request: parse, check the pod is ours, call the host, pass the answer on.
    async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let call = match route::parse(req.uri().path(), req.uri().query()) {
            Ok(c) => c,
            Err(e @ route::Refused::NotFound(_)) => {
                return text(StatusCode::NOT_FOUND, e.to_string());
            }
            Err(e) => return text(StatusCode::BAD_REQUEST, e.to_string()),
        };
        let span = tracing::info_span!("kubelet", kind = %call.kind, ns = %call.namespace, pod = %call.pod);
        self.forward(call, req, span.clone()).instrument(span).await
    }

    /// [`Self::handle`] once the request is a call; `span` follows a stream it starts.
    async fn forward(
        &self,
        call: route::Call,
        mut req: Request<Incoming>,
        span: tracing::Span,
    ) -> Response<Body> {
        match self.owns(&call).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::info!("kubelet call refused: no host pod of this tenant for it");
                return text(
                    StatusCode::NOT_FOUND,
                    format!("pod {}/{} not found", call.namespace, call.pod),
                );
            }
            Err(e) => {
                tracing::warn!(error = %crate::chain(&e), "kubelet call: host pod lookup failed");
                return text(StatusCode::BAD_GATEWAY, "the host did not answer");
            }
        }
        let mut host_req = Request::builder()
            .method(req.method().clone())
            .uri(call.host_uri(&self.key));
        for name in PASSED_HEADERS {
            for v in req.headers().get_all(name) {
                host_req = host_req.header(name, v.clone());
            }
        }
        let host_req = match host_req.body(kube::client::Body::empty()) {
            Ok(r) => r,
            Err(e) => return text(StatusCode::BAD_REQUEST, e.to_string()),
        };
        let tenant_upgrade = call.kind.upgrades().then(|| hyper::upgrade::on(&mut req));
        let mut res = match self.host.send(host_req).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %crate::chain(&e), "kubelet call: host request failed");
                return text(StatusCode::BAD_GATEWAY, "the host did not answer");
            }
        };
        tracing::info!(status = res.status().as_u16(), "kubelet call");
        let mut out = Response::builder().status(res.status());
        for (k, v) in res.headers() {
            out = out.header(k, v);
        }
        if res.status() == StatusCode::SWITCHING_PROTOCOLS {
            let Some(tenant_upgrade) = tenant_upgrade else {
                return text(
                    StatusCode::BAD_GATEWAY,
                    "the host switched protocols unasked",
                );
            };
            let host_upgrade = hyper::upgrade::on(&mut res);
            // exec and attach over SPDY can be ended with a reason ([`spdy`]); `Some(true)` when
            // the protocol is one whose server always writes a status at the end (v4 and v5),
            // so a host connection that ends without one broke.
            let said_with_status = matches!(call.kind, route::Kind::Exec | route::Kind::Attach)
                .then(|| header_str(&res, "upgrade"))
                .filter(|u| u.to_ascii_lowercase().starts_with("spdy/"))
                .map(|_| {
                    let v = header_str(&res, "x-stream-protocol-version");
                    v.starts_with("v4.") || v.starts_with("v5.")
                });
            let stopping = self.stopping.clone();
            tokio::spawn(
                async move {
                    let (tenant, host) = match tokio::try_join!(tenant_upgrade, host_upgrade) {
                        Ok(both) => both,
                        Err(e) => {
                            tracing::info!(error = %e, "kubelet stream: upgrade failed");
                            return;
                        }
                    };
                    let (mut tenant, mut host) = (TokioIo::new(tenant), TokioIo::new(host));
                    if let Some(statused) = said_with_status {
                        pump_spdy(tenant, host, stopping, statused).await;
                        return;
                    }
                    match tokio::io::copy_bidirectional(&mut tenant, &mut host).await {
                        Ok((up, down)) => tracing::debug!(up, down, "kubelet stream ended"),
                        Err(e) => tracing::info!(error = %e, "kubelet stream broken"),
                    }
                }
                .instrument(span),
            );
            return out
                .body(
                    Full::new(Bytes::new())
                        .map_err(|never| match never {})
                        .boxed_unsync(),
                )
                .unwrap_or_else(|e| text(StatusCode::BAD_GATEWAY, e.to_string()));
        }
        let body = if call.kind == route::Kind::Logs && res.status().is_success() {
            ending_on_stop(res.into_body(), self.stopping.clone())
        } else {
            res.into_body().map_err(|e| Box::new(e) as _).boxed_unsync()
        };
        out.body(body)
            .unwrap_or_else(|e| text(StatusCode::BAD_GATEWAY, e.to_string()))
    }

    /// Whether the host pod of `call` is this tenant's copy of exactly that tenant pod (and of
    /// that UID, when the call names one). A namespace the host does not let this syncer read
    /// is not one of its own (it reads pods only where it bound its role: its own host
    /// namespaces), so no pod there is this tenant's: answered as one that does not exist,
    /// not as a host failure.
    async fn owns(&self, call: &route::Call) -> Result<bool> {
        let ns = call.host_namespace(&self.key);
        let pod =
            match kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(self.host.clone(), &ns)
                .get_opt(&call.pod)
                .await
            {
                Err(kube::Error::Api(ae)) if ae.code == 403 => return Ok(false),
                other => {
                    other.map_err(crate::kube_err(format!("get host pod {ns}/{}", call.pod)))?
                }
            };
        let Some(pod) = pod else { return Ok(false) };
        let Some(r) = naming::tenant_ref(&self.key, pod.labels(), pod.annotations()) else {
            return Ok(false);
        };
        Ok(r.namespace.as_deref() == Some(call.namespace.as_str())
            && r.name == call.pod
            && call.uid.as_ref().is_none_or(|u| r.uid.as_ref() == Some(u)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    /// The tenant's and the host's far ends of a pumped stream that has an error stream (1) and
    /// a stdout stream (3); the pump runs until it returns.
    async fn pumped(
        host_says_status: bool,
    ) -> (
        DuplexStream,
        DuplexStream,
        tokio::sync::watch::Sender<bool>,
        tokio::task::JoinHandle<()>,
    ) {
        let (tenant, tenant_far) = tokio::io::duplex(64 * 1024);
        let (host, mut host_far) = tokio::io::duplex(64 * 1024);
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let pump = tokio::spawn(pump_spdy(tenant, host, stopping, host_says_status));
        let mut tenant_far = tenant_far;
        let mut c = spdy::testing::Client::new();
        let mut opening = c.syn_stream(1, "error");
        opening.extend(c.syn_stream(3, "stdout"));
        tenant_far.write_all(&opening).await.unwrap();
        let mut seen = vec![0; opening.len()];
        host_far.read_exact(&mut seen).await.unwrap();
        assert_eq!(
            seen, opening,
            "the client's frames reach the host unchanged"
        );
        (tenant_far, host_far, stop, pump)
    }

    async fn rest(mut r: DuplexStream) -> Vec<u8> {
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), r.read_to_end(&mut got))
            .await
            .expect("the stream ends")
            .unwrap();
        got
    }

    fn status_of(bytes: &[u8]) -> (u32, serde_json::Value) {
        let stream = u32::from_be_bytes(bytes[..4].try_into().unwrap());
        assert_eq!(bytes[4], 1, "the last frame of its stream");
        (stream, serde_json::from_slice(&bytes[8..]).unwrap())
    }

    #[tokio::test]
    async fn a_stopping_syncer_ends_an_exec_stream_with_a_status_saying_why() {
        let (mut tenant, mut host, stop, pump) = pumped(true).await;
        let out = spdy::data_frame(3, false, b"partial output");
        host.write_all(&out).await.unwrap();
        let mut first = vec![0; out.len()];
        tenant.read_exact(&mut first).await.unwrap();
        assert_eq!(first, out, "what the host sent first");
        stop.send(true).unwrap();
        let (stream, status) = status_of(&rest(tenant).await);
        assert_eq!(stream, 1);
        assert_eq!(status["status"], "Failure");
        assert_eq!(status["message"], STOP_STATUS);
        pump.await.unwrap();
    }

    #[tokio::test]
    async fn a_host_connection_that_ends_without_a_status_is_reported_broken() {
        let (tenant, host, _stop, pump) = pumped(true).await;
        drop(host);
        let (stream, status) = status_of(&rest(tenant).await);
        assert_eq!(stream, 1);
        assert_eq!(status["message"], BROKEN_STATUS);
        pump.await.unwrap();
    }

    #[tokio::test]
    async fn a_finished_command_keeps_the_hosts_status_alone() {
        let (tenant, mut host, stop, pump) = pumped(true).await;
        let done = spdy::data_frame(1, true, br#"{"status":"Success"}"#);
        host.write_all(&done).await.unwrap();
        drop(host);
        assert_eq!(rest(tenant).await, done);
        let _ = stop.send(true);
        pump.await.unwrap();
    }

    #[tokio::test]
    async fn an_older_protocol_whose_end_carries_no_status_ends_silently() {
        let (tenant, host, _stop, pump) = pumped(false).await;
        drop(host);
        assert!(rest(tenant).await.is_empty());
        pump.await.unwrap();
    }
}
