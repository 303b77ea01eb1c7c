//! The devnode's kubelet API: what the host apiserver calls for `kubectl logs`.
//!
//! The apiserver dials the node's InternalDNS address (`localhost`) on
//! `status.daemonEndpoints.kubeletEndpoint.Port` over TLS, verifying the serving certificate
//! with the dev cluster CA and presenting its kubelet client certificate, which this endpoint
//! requires (signed by the same CA). `GET /containerLogs/{ns}/{pod}/{container}` reads the
//! container's log file ([`crate::container::log_path`]): raw stdout and stderr, one run after
//! each `--- vcp-devnode: starting` marker line. The current run is the last one, `previous`
//! the one before; `tailLines`, `limitBytes` and `follow` behave as a kubelet's (a followed log
//! ends when the container stops or starts again, or the file goes away); `timestamps` is ignored, the
//! file has none.
//!
//! `/metrics/resource` is the usage of the containers' processes, as metrics-server reads a
//! kubelet's ([`crate::usage`]).
//!
//! `/exec/...` and `/portForward/...` need the SPDY (and WebSocket) streaming protocols, which
//! only Go implements; they go to our helper `devnode-streams` (tests/kube-bin/devnode-streams,
//! k8s.io/cri-streaming) on a Unix socket, byte for byte after the upgrade, with the headers
//! `Vcp-Pid` (the container's process, from its status `containerID` `devnode://<pid>`) and
//! `Vcp-Pod-Ip`. Without the helper those calls answer 503 and everything else still works.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{ObjectRef, Store};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// The line the devnode writes to a log file before each start of the container.
pub const RUN_MARKER: &[u8] = b"--- vcp-devnode: starting ";
/// How often a followed log is checked for more output.
const FOLLOW_POLL: Duration = Duration::from_millis(200);
/// A followed log ends after this many polls without output from a container that is not
/// running (2 s).
const STOPPED_POLLS: u32 = 10;

/// Where the kubelet endpoint's certificates are.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// Serving certificate (PEM chain) naming `localhost`.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// CA a client certificate must be signed by: the dev cluster's.
    pub client_ca: PathBuf,
}

/// A kubelet endpoint's setup could not be read.
#[derive(Debug, thiserror::Error)]
#[error("kubelet endpoint: {path}: {message}")]
pub struct TlsError {
    pub path: PathBuf,
    pub message: String,
}

/// TLS for the endpoint: its serving certificate, client certificates required and verified
/// against the cluster CA.
pub fn tls_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let bad = |path: &Path, e: &dyn std::fmt::Display| TlsError {
        path: path.to_owned(),
        message: e.to_string(),
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|i| i.collect())
        .map_err(|e| bad(&files.cert, &e))?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| bad(&files.key, &e))?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in
        CertificateDer::pem_file_iter(&files.client_ca).map_err(|e| bad(&files.client_ca, &e))?
    {
        let ca = ca.map_err(|e| bad(&files.client_ca, &e))?;
        roots.add(ca).map_err(|e| bad(&files.client_ca, &e))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .map_err(|e| bad(&files.client_ca, &e))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(&files.cert, &e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| bad(&files.cert, &e))?;
    // HTTP/1.1 only: the streaming protocols are upgrades of an HTTP/1.1 request.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// What the endpoint serves from.
pub struct Endpoint {
    /// Container log files.
    pub logs_dir: PathBuf,
    /// The pods bound to this node (for a container's process and the pod's IP).
    pub pods: Store<Pod>,
    /// The `devnode-streams` helper's socket, when it runs.
    pub streams: Option<PathBuf>,
}

/// Serves the endpoint on `listener` until the future is dropped.
pub async fn serve(listener: TcpListener, tls: Arc<rustls::ServerConfig>, endpoint: Endpoint) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let endpoint = Arc::new(endpoint);
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
            let service = hyper::service::service_fn(move |req| {
                let endpoint = endpoint.clone();
                async move { Ok::<_, std::convert::Infallible>(handle(&endpoint, req).await) }
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

type Body = UnsyncBoxBody<Bytes, std::io::Error>;

fn text(status: StatusCode, msg: impl Into<String>) -> Response<Body> {
    let mut res = Response::new(
        Full::new(Bytes::from(msg.into() + "\n"))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *res.status_mut() = status;
    res
}

/// A `containerLogs` request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogsCall {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub follow: bool,
    pub previous: bool,
    pub tail_lines: Option<usize>,
    pub limit_bytes: Option<usize>,
}

/// Parses a kubelet `containerLogs` path and query; `None` for anything else.
pub fn parse_logs(path: &str, query: Option<&str>) -> Option<LogsCall> {
    let rest = path.strip_prefix("/containerLogs/")?;
    let parts: Vec<&str> = rest.split('/').collect();
    let [ns, pod, container] = parts.as_slice() else {
        return None;
    };
    // Names are DNS labels or subdomains: nothing here may climb out of the logs directory.
    let name_ok = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            && !s.starts_with('.')
    };
    if ![ns, pod, container].iter().all(|s| name_ok(s)) {
        return None;
    }
    let mut call = LogsCall {
        namespace: (*ns).to_owned(),
        pod: (*pod).to_owned(),
        container: (*container).to_owned(),
        ..Default::default()
    };
    for pair in query.unwrap_or_default().split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "follow" => call.follow = v == "true" || v == "1",
            "previous" => call.previous = v == "true" || v == "1",
            "tailLines" => call.tail_lines = v.parse().ok(),
            "limitBytes" => call.limit_bytes = v.parse().ok().filter(|n| *n > 0),
            _ => {}
        }
    }
    Some(call)
}

/// Offsets (start of content, end) of each run in a log file: the bytes after each marker
/// line; output before the first marker counts as a run of its own only if there is any.
pub fn runs(content: &[u8]) -> Vec<(usize, usize)> {
    let mut markers = Vec::new(); // (line start, line end incl. newline)
    let mut pos = 0;
    while pos < content.len() {
        let end = content[pos..]
            .iter()
            .position(|b| *b == b'\n')
            .map_or(content.len(), |i| pos + i + 1);
        if content[pos..].starts_with(RUN_MARKER) {
            markers.push((pos, end));
        }
        pos = end;
    }
    let mut out = Vec::new();
    let first = markers.first().map_or(content.len(), |m| m.0);
    if first > 0 {
        out.push((0, first));
    }
    for (i, (_, body)) in markers.iter().enumerate() {
        let next = markers.get(i + 1).map_or(content.len(), |m| m.0);
        out.push((*body, next));
    }
    out
}

/// The last `n` lines of `s` (a final line without a newline counts).
pub fn tail(s: &[u8], n: usize) -> &[u8] {
    if n == 0 {
        return &[];
    }
    let body = s.strip_suffix(b"\n").unwrap_or(s);
    let mut seen = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == n {
                return &s[i + 1..];
            }
        }
    }
    s
}

async fn handle(endpoint: &Endpoint, req: Request<Incoming>) -> Response<Body> {
    if let Some(call) = parse_stream(req.uri().path()) {
        return stream(endpoint, &call, req).await;
    }
    if req.method() != http::Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET is served");
    }
    if req.uri().path() == "/metrics/resource" {
        return resource_metrics(endpoint);
    }
    let Some(call) = parse_logs(req.uri().path(), req.uri().query()) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("{} is not served by the devnode", req.uri().path()),
        );
    };
    logs(endpoint, &call).await
}

/// An exec or port-forward call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamCall {
    pub exec: bool,
    pub namespace: String,
    pub pod: String,
    /// The container (exec only).
    pub container: Option<String>,
}

/// Parses `/exec/{ns}/{pod}[/{uid}]/{container}` and `/portForward/{ns}/{pod}[/{uid}]`.
pub fn parse_stream(path: &str) -> Option<StreamCall> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (exec, rest) = parts.split_first()?;
    let exec = match *exec {
        "exec" => true,
        "portForward" => false,
        _ => return None,
    };
    let (ns, pod, container) = match (exec, rest) {
        (true, [ns, pod, c] | [ns, pod, _, c]) => (ns, pod, Some((*c).to_owned())),
        (false, [ns, pod] | [ns, pod, _]) => (ns, pod, None),
        _ => return None,
    };
    Some(StreamCall {
        exec,
        namespace: (*ns).to_owned(),
        pod: (*pod).to_owned(),
        container,
    })
}

/// `/metrics/resource`: the usage of every running container here ([`crate::usage`]).
fn resource_metrics(endpoint: &Endpoint) -> Response<Body> {
    use kube::ResourceExt;
    let mut roots = Vec::new();
    for pod in endpoint.pods.state() {
        let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
        for c in pod
            .status
            .iter()
            .flat_map(|s| s.container_statuses.iter().flatten())
        {
            let started = c
                .state
                .as_ref()
                .and_then(|s| s.running.as_ref())
                .and_then(|r| r.started_at.as_ref())
                .map_or(0.0, |t| t.0.as_millisecond() as f64 / 1000.0);
            if let Some(pid) = container_pid(&pod, &c.name) {
                roots.push((pid, (ns.clone(), name.clone(), c.name.clone(), started)));
            }
        }
    }
    let containers: Vec<_> = crate::usage::sample(&roots)
        .into_iter()
        .map(
            |((namespace, pod, container, started), usage)| crate::usage::ContainerUsage {
                namespace,
                pod,
                container,
                started,
                usage,
            },
        )
        .collect();
    let now = k8s_openapi::jiff::Timestamp::now().as_millisecond();
    let mut res = text(StatusCode::OK, crate::usage::render(&containers, now));
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    res
}

/// The process of a running container: its status' `containerID`, `devnode://<pid>`.
fn container_pid(pod: &Pod, container: &str) -> Option<u32> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == container && c.state.as_ref().is_some_and(|s| s.running.is_some()))?
        .container_id
        .as_deref()?
        .strip_prefix("devnode://")?
        .parse()
        .ok()
}

/// Passes an exec or port-forward call to the helper, and the upgraded connection through.
async fn stream(endpoint: &Endpoint, call: &StreamCall, req: Request<Incoming>) -> Response<Body> {
    let Some(socket) = endpoint.streams.clone() else {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "the devnode runs without devnode-streams (tests/kube-bin/build.sh builds it): no exec or port-forward",
        );
    };
    let Some(pod) = endpoint
        .pods
        .get(&ObjectRef::new(&call.pod).within(&call.namespace))
    else {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod {}/{} is not on this node", call.namespace, call.pod),
        );
    };
    let extra = if let Some(c) = &call.container {
        match container_pid(&pod, c) {
            Some(pid) => ("vcp-pid", pid.to_string()),
            None => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "container {c} of pod {}/{} is not running",
                        call.namespace, call.pod
                    ),
                );
            }
        }
    } else {
        match pod.status.as_ref().and_then(|s| s.pod_ip.clone()) {
            Some(ip) => ("vcp-pod-ip", ip),
            None => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("pod {}/{} has no IP yet", call.namespace, call.pod),
                );
            }
        }
    };
    match proxy(&socket, extra, req).await {
        Ok(res) => res,
        Err(e) => {
            tracing::warn!(error = %e, "kubelet endpoint: devnode-streams failed");
            text(StatusCode::BAD_GATEWAY, format!("devnode-streams: {e}"))
        }
    }
}

async fn proxy(
    socket: &Path,
    (name, value): (&'static str, String),
    mut req: Request<Incoming>,
) -> Result<Response<Body>, Box<dyn std::error::Error + Send + Sync>> {
    let conn = tokio::net::UnixStream::connect(socket).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(conn)).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "devnode-streams connection ended");
        }
    });
    let mut out = Request::builder()
        .method(req.method().clone())
        .uri(req.uri().path_and_query().map_or("/", |p| p.as_str()));
    for (k, v) in req.headers() {
        if !k.as_str().starts_with("vcp-") {
            out = out.header(k, v);
        }
    }
    let out = out
        .header(name, value)
        .body(http_body_util::Empty::<Bytes>::new())?;
    let client_side = hyper::upgrade::on(&mut req);
    let res = sender.send_request(out).await?;
    if res.status() != StatusCode::SWITCHING_PROTOCOLS {
        let (parts, body) = res.into_parts();
        return Ok(Response::from_parts(
            parts,
            body.map_err(std::io::Error::other).boxed_unsync(),
        ));
    }
    let mut back = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
    for (k, v) in res.headers() {
        back = back.header(k, v);
    }
    let helper_side = hyper::upgrade::on(res);
    tokio::spawn(async move {
        match tokio::try_join!(client_side, helper_side) {
            Ok((a, b)) => {
                let (mut a, mut b) = (TokioIo::new(a), TokioIo::new(b));
                let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
            }
            Err(e) => tracing::debug!(error = %e, "kubelet endpoint: upgrade failed"),
        }
    });
    Ok(back.body(
        http_body_util::Empty::<Bytes>::new()
            .map_err(|never| match never {})
            .boxed_unsync(),
    )?)
}

async fn logs(endpoint: &Endpoint, call: &LogsCall) -> Response<Body> {
    let path = crate::container::log_path(
        &endpoint.logs_dir,
        &call.namespace,
        &call.pod,
        &call.container,
    );
    let content = match tokio::fs::read(&path).await {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return text(
                StatusCode::NOT_FOUND,
                format!(
                    "container {} of pod {}/{} has no log",
                    call.container, call.namespace, call.pod
                ),
            );
        }
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let all = runs(&content);
    let pick = if call.previous {
        all.len().checked_sub(2)
    } else {
        all.len().checked_sub(1)
    };
    let Some(&(start, end)) = pick.and_then(|i| all.get(i)) else {
        let msg = if call.previous {
            format!(
                "previous terminated container \"{}\" in pod \"{}\" not found",
                call.container, call.pod
            )
        } else {
            format!("container \"{}\" has not started yet", call.container)
        };
        return text(StatusCode::BAD_REQUEST, msg);
    };
    let mut first = &content[start..end];
    if let Some(n) = call.tail_lines {
        first = tail(first, n);
    }
    let mut budget = call.limit_bytes.unwrap_or(usize::MAX);
    let first = Bytes::copy_from_slice(&first[..first.len().min(budget)]);
    budget -= first.len();
    // Only the current run grows.
    if !call.follow || call.previous || budget == 0 {
        return Response::new(
            Full::new(first)
                .map_err(|never| match never {})
                .boxed_unsync(),
        );
    }
    let state = Follow {
        path,
        pods: endpoint.pods.clone(),
        call: call.clone(),
        stopped_polls: 0,
        offset: content.len() as u64,
        budget,
        first: Some(first),
        done: false,
    };
    let stream = futures::stream::unfold(state, |mut s| async move {
        if let Some(b) = s.first.take() {
            return Some((Ok(Frame::data(b)), s));
        }
        loop {
            if s.done || s.budget == 0 {
                return None;
            }
            tokio::time::sleep(FOLLOW_POLL).await;
            match s.more().await {
                Ok(Some(b)) => return Some((Ok(Frame::data(b)), s)),
                // Nothing new, and nothing more will come: a kubelet ends the stream too. The
                // status lags the process by a tick or two, hence a grace before believing it.
                Ok(None) if !s.running() => {
                    s.stopped_polls += 1;
                    if s.stopped_polls >= STOPPED_POLLS {
                        return None;
                    }
                }
                Ok(None) => s.stopped_polls = 0,
                Err(e) => return Some((Err(e), s)),
            }
        }
    });
    Response::new(BodyExt::boxed_unsync(StreamBody::new(stream)))
}

/// A followed log: where it is read to, and how much more may be sent.
struct Follow {
    path: PathBuf,
    pods: Store<Pod>,
    call: LogsCall,
    /// Polls in a row that found the container not running.
    stopped_polls: u32,
    offset: u64,
    budget: usize,
    first: Option<Bytes>,
    done: bool,
}

impl Follow {
    /// Whether the followed container still runs (and so may write more).
    fn running(&self) -> bool {
        let c = &self.call;
        self.pods
            .get(&ObjectRef::new(&c.pod).within(&c.namespace))
            .is_some_and(|p| container_pid(&p, &c.container).is_some())
    }

    /// New output since the last read, up to the next run's marker (which ends the follow).
    async fn more(&mut self) -> std::io::Result<Option<Bytes>> {
        use tokio::io::{AsyncReadExt, AsyncSeekExt};
        let mut f = match tokio::fs::File::open(&self.path).await {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.done = true;
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let len = f.metadata().await?.len();
        if len < self.offset {
            // Truncated or replaced: not the run being followed any more.
            self.done = true;
            return Ok(None);
        }
        if len == self.offset {
            return Ok(None);
        }
        f.seek(std::io::SeekFrom::Start(self.offset)).await?;
        let mut buf = Vec::new();
        f.take(len - self.offset).read_to_end(&mut buf).await?;
        self.offset += buf.len() as u64;
        // The container started again: its new run is not this one.
        let restart = if buf.starts_with(RUN_MARKER) {
            Some(0)
        } else {
            let mut needle = b"\n".to_vec();
            needle.extend_from_slice(RUN_MARKER);
            buf.windows(needle.len())
                .position(|w| w == needle.as_slice())
                .map(|i| i + 1)
        };
        if let Some(at) = restart {
            buf.truncate(at);
            self.done = true;
        }
        buf.truncate(buf.len().min(self.budget));
        self.budget -= buf.len();
        Ok((!buf.is_empty()).then(|| Bytes::from(buf)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &[u8] = b"--- vcp-devnode: starting /bin/sh -c x\none\ntwo\n\
--- vcp-devnode: starting /bin/sh -c x\nthree\nfour\nfive\n";

    #[test]
    fn runs_split_at_each_start_marker() {
        let r = runs(LOG);
        assert_eq!(r.len(), 2);
        assert_eq!(&LOG[r[0].0..r[0].1], b"one\ntwo\n");
        assert_eq!(&LOG[r[1].0..r[1].1], b"three\nfour\nfive\n");
        assert_eq!(runs(b"early\n").len(), 1);
        assert!(runs(b"").is_empty());
    }

    #[test]
    fn tail_counts_lines_from_the_end() {
        assert_eq!(tail(b"a\nb\nc\n", 2), b"b\nc\n");
        assert_eq!(tail(b"a\nb\nc", 2), b"b\nc");
        assert_eq!(tail(b"a\nb\n", 5), b"a\nb\n");
        assert_eq!(tail(b"a\nb\n", 0), b"");
    }

    #[test]
    fn logs_paths_parse_and_odd_names_are_refused() {
        let c = parse_logs(
            "/containerLogs/ns/pod-0/c",
            Some("tailLines=3&follow=true&limitBytes=10&timestamps=true"),
        )
        .unwrap();
        assert_eq!(
            (c.namespace.as_str(), c.pod.as_str(), c.container.as_str()),
            ("ns", "pod-0", "c")
        );
        assert_eq!(
            (c.follow, c.previous, c.tail_lines, c.limit_bytes),
            (true, false, Some(3), Some(10))
        );
        for bad in [
            "/containerLogs/ns/pod",
            "/containerLogs/../pod/c",
            "/containerLogs/ns/pod/c/x",
            "/containerLogs/ns/Pod/c",
            "/exec/ns/pod/c",
        ] {
            assert_eq!(parse_logs(bad, None), None, "{bad}");
        }
    }

    #[test]
    fn exec_and_port_forward_paths_with_and_without_a_uid() {
        let exec = parse_stream("/exec/ns/pod/c").unwrap();
        assert!(exec.exec);
        assert_eq!(exec.container.as_deref(), Some("c"));
        assert_eq!(parse_stream("/exec/ns/pod/uid-1/c"), Some(exec.clone()));
        let pf = parse_stream("/portForward/ns/pod").unwrap();
        assert!(!pf.exec && pf.container.is_none() && pf.pod == "pod");
        assert_eq!(parse_stream("/portForward/ns/pod/uid"), Some(pf));
        for bad in [
            "/exec/ns/pod",
            "/portForward/ns",
            "/attach/ns/pod/c",
            "/containerLogs/a/b/c",
        ] {
            assert_eq!(parse_stream(bad), None, "{bad}");
        }
    }
}
