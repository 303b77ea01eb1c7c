//! The tenant apiserver's control-plane egress: a CONNECT relay in its own pod, served by the
//! revocation authorizer on a Unix socket.
//!
//! Data flow: kube-apiserver dials its authorization webhook and every admission or conversion
//! webhook given by URL in its `controlplane` egress context (k8s.io/apiserver
//! `pkg/util/webhook/authentication.go`, kubernetes `pkg/controlplane/apiserver/config.go`).
//! Its egress configuration (templates/kube-apiserver.yaml) sends that context as
//! `CONNECT host:port` over `--egress-socket`, a socket on a volume the two containers share.
//! [`Relay::serve`] reads each CONNECT (its head bounded by [`MAX_HEAD`] and [`HANDSHAKE`]),
//! [`decide::hop`] says where it goes, and the relay either dials the authorizer's own webhook
//! on the pod's loopback, or opens the same CONNECT on the syncer's egress proxy
//! ([`crate::egress`], over mutual TLS with the apiserver's kubelet client certificate, as the
//! `cluster` context does) and splices the two connections once the syncer says `200`.
//!
//! Why here and not straight to the syncer: the authorization webhook is the revocation
//! authorizer, which must keep answering while the syncer is down, stopped or crashing; going
//! through the relay it never leaves the pod. Why chained and not judged here: the syncer
//! holds the tenant's addresses (its pod and Service watches), so the allow list stays in one
//! place, and a webhook URL reaches exactly what a webhook by Service could.
//!
//! Whatever goes wrong past the decision (the syncer unreachable, its refusal, a malformed
//! target) is answered with the proxy's one refusal ([`crate::egress::refused`]), so nothing
//! tells the tenant whether a target is open, closed or outside. Only the syncer's own `502`
//! and `504`, which it gives for the tenant's own targets alone, are passed on as they are.
//! While the syncer is down, every webhook by URL therefore fails, as webhooks by Service do.
//!
//! The audit webhook's target, vcp's ingest ([`Relay::with_audit_ingest`]), is dialled from
//! the pod directly, as [`decide`] explains.

pub mod decide;

use crate::answer::Body;
use crate::egress::allow::Target;
use crate::{Error, Result};
use bytes::Bytes;
use decide::{Hop, hop_with};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::upgrade::Upgraded;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UnixListener;

/// The largest request head the relay reads (hyper's smallest buffer): the apiserver sends a
/// request line and one header, and a bound keeps anything else on the socket from growing the
/// authorizer's memory.
pub const MAX_HEAD: usize = 8192;

/// How long a connection may take to send its request head.
pub const HANDSHAKE: Duration = Duration::from_secs(10);

/// How long the syncer may take to answer a chained CONNECT: longer than its own dial timeout
/// (10 s), so a target of the tenant's that does not answer gets the syncer's `504` rather
/// than a refusal.
pub const CHAIN_TIMEOUT: Duration = Duration::from_secs(15);

/// How long the authorizer's own webhook may take to accept.
const LOCAL_DIAL_TIMEOUT: Duration = Duration::from_secs(3);

/// How long vcp's audit ingest may take to accept (the apiserver's audit webhook retries a
/// batch that fails).
const INGEST_DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// The files of the chained hop: the same as the apiserver's `cluster` context uses.
#[derive(Debug, Clone)]
pub struct ChainTls<'a> {
    /// The CA that signed the syncer's serving certificate (the tenant CA).
    pub ca: &'a Path,
    /// The apiserver's kubelet client certificate and key, the only client the proxy serves.
    pub cert: &'a Path,
    pub key: &'a Path,
}

/// The relay of one apiserver pod.
pub struct Relay {
    /// The authorizer's webhook, as bound.
    listen: SocketAddr,
    /// The syncer's egress proxy: host (a name or an IP) and port.
    proxy: (String, u16),
    server_name: ServerName<'static>,
    tls: Arc<rustls::ClientConfig>,
    /// [`HANDSHAKE`] (shorter in tests).
    handshake: Duration,
    /// vcp's audit ingest, dialled from the pod ([`decide::hop_with`]).
    ingest: Option<Target>,
}

/// What the syncer made of a chained CONNECT.
enum Chained {
    /// `200`: the connection to the target.
    Open(Upgraded),
    /// Any other answer.
    Answered(StatusCode),
    /// No answer: why, for the log.
    Failed(String),
}

impl Relay {
    /// A relay for the webhook bound at `listen`, chaining to the proxy at `proxy_url`
    /// (`https://host[:port]`), with `tls` for that hop. Reads the files now, as the apiserver
    /// reads its own egress files once: a reissue rolls the pod.
    pub fn new(listen: SocketAddr, proxy_url: &str, tls: &ChainTls<'_>) -> Result<Relay> {
        let bad = |what: String| Error::Relay(what);
        let uri: http::Uri = proxy_url
            .parse()
            .map_err(|e| bad(format!("{proxy_url}: {e}")))?;
        if uri.scheme_str() != Some("https") {
            return Err(bad(format!("{proxy_url}: the proxy is reached over https")));
        }
        let host = uri
            .host()
            .map(|h| h.trim_start_matches('[').trim_end_matches(']').to_owned())
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad(format!("{proxy_url}: no host")))?;
        let port = uri.port_u16().unwrap_or(443);
        let server_name =
            ServerName::try_from(host.clone()).map_err(|e| bad(format!("{proxy_url}: {e}")))?;
        let file = |path: &Path, e: &dyn std::fmt::Display| bad(format!("{}: {e}", path.display()));
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(tls.ca).map_err(|e| file(tls.ca, &e))? {
            let cert = cert.map_err(|e| file(tls.ca, &e))?;
            roots.add(cert).map_err(|e| file(tls.ca, &e))?;
        }
        if roots.is_empty() {
            return Err(file(tls.ca, &"no certificate"));
        }
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(tls.cert)
            .and_then(|i| i.collect())
            .map_err(|e| file(tls.cert, &e))?;
        let key = PrivateKeyDer::from_pem_file(tls.key).map_err(|e| file(tls.key, &e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(e.to_string()))?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .map_err(|e| file(tls.cert, &e))?;
        // The kubelet endpoint speaks HTTP/1.1 only; CONNECT is an HTTP/1.1 request here.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Relay {
            listen,
            proxy: (host, port),
            server_name,
            tls: Arc::new(config),
            handshake: HANDSHAKE,
            ingest: None,
        })
    }

    /// The same relay, also dialling vcp's audit ingest at `authority` (`host:port`) from the
    /// pod.
    pub fn with_audit_ingest(mut self, authority: &str) -> Result<Relay> {
        let target = Target::parse(authority).ok_or_else(|| {
            Error::Relay(format!("--audit-ingest {authority:?} is not host:port"))
        })?;
        self.ingest = Some(target);
        Ok(self)
    }

    /// Serves the apiserver's CONNECTs on `listener` until the future is dropped.
    pub async fn serve(self: Arc<Self>, listener: UnixListener) {
        loop {
            let stream = match listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "egress relay: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let relay = self.clone();
            tokio::spawn(async move {
                let handshake = relay.handshake;
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let relay = relay.clone();
                    async move { Ok::<_, std::convert::Infallible>(relay.connect(req).await) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(handshake)
                    .max_buf_size(MAX_HEAD)
                    .serve_connection(TokioIo::new(stream), service)
                    .with_upgrades();
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "egress relay: connection ended");
                }
            });
        }
    }

    /// Answers one request of the apiserver: a CONNECT is relayed, anything else refused.
    async fn connect(&self, req: Request<Incoming>) -> Response<Body> {
        if req.method() != Method::CONNECT {
            return crate::egress::refused();
        }
        let authority = req
            .uri()
            .authority()
            .map(|a| a.as_str().to_owned())
            .unwrap_or_default();
        match hop_with(&authority, self.listen, self.ingest.as_ref()) {
            Hop::Refuse => {
                tracing::warn!(target_addr = %authority, reason = "malformed", "egress refused");
                crate::egress::refused()
            }
            Hop::Local(addr) => {
                let dial = tokio::net::TcpStream::connect(addr);
                match tokio::time::timeout(LOCAL_DIAL_TIMEOUT, dial).await {
                    Ok(Ok(upstream)) => {
                        tracing::debug!(target_addr = %authority, "egress relay: the authorizer");
                        splice(req, upstream)
                    }
                    // The webhook is this process: it does not answer only while it stops.
                    Ok(Err(e)) => {
                        tracing::warn!(target_addr = %authority, error = %e, "egress relay: the authorizer did not answer");
                        crate::answer::text(StatusCode::BAD_GATEWAY, "egress dial failed")
                    }
                    Err(_) => {
                        tracing::warn!(target_addr = %authority, "egress relay: the authorizer did not answer");
                        crate::answer::text(StatusCode::GATEWAY_TIMEOUT, "egress dial timed out")
                    }
                }
            }
            Hop::Ingest(target) => {
                // Resolved at each dial, as the syncer's name is.
                let dial = tokio::net::TcpStream::connect(target.clone());
                match tokio::time::timeout(INGEST_DIAL_TIMEOUT, dial).await {
                    Ok(Ok(upstream)) => {
                        tracing::debug!(target_addr = %target, "egress relay: vcp's audit ingest");
                        splice(req, upstream)
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(target_addr = %target, error = %e, "egress relay: vcp's audit ingest did not answer");
                        crate::answer::text(StatusCode::BAD_GATEWAY, "egress dial failed")
                    }
                    Err(_) => {
                        tracing::warn!(target_addr = %target, "egress relay: vcp's audit ingest did not answer");
                        crate::answer::text(StatusCode::GATEWAY_TIMEOUT, "egress dial timed out")
                    }
                }
            }
            Hop::Chain(target) => {
                let chained = tokio::time::timeout(CHAIN_TIMEOUT, self.chain(&target))
                    .await
                    .unwrap_or_else(|_| {
                        Chained::Failed("the syncer did not answer in time".into())
                    });
                match chained {
                    Chained::Open(upstream) => {
                        tracing::debug!(target_addr = %target, "egress relay: through the syncer");
                        splice(req, TokioIo::new(upstream))
                    }
                    // The syncer's own answers for the tenant's own targets that do not answer.
                    Chained::Answered(StatusCode::BAD_GATEWAY) => {
                        crate::answer::text(StatusCode::BAD_GATEWAY, "egress dial failed")
                    }
                    Chained::Answered(StatusCode::GATEWAY_TIMEOUT) => {
                        crate::answer::text(StatusCode::GATEWAY_TIMEOUT, "egress dial timed out")
                    }
                    Chained::Answered(status) => {
                        tracing::info!(target_addr = %target, status = status.as_u16(), "egress refused by the syncer");
                        crate::egress::refused()
                    }
                    Chained::Failed(error) => {
                        tracing::warn!(target_addr = %target, %error, "egress refused: the syncer's proxy is unreachable");
                        crate::egress::refused()
                    }
                }
            }
        }
    }

    /// Asks the syncer's proxy for `target` (`host:port`, canonical: [`decide::hop`]).
    async fn chain(&self, target: &str) -> Chained {
        let fail = |what: &str, e: &dyn std::fmt::Display| Chained::Failed(format!("{what}: {e}"));
        let (host, port) = (&self.proxy.0, self.proxy.1);
        // Resolved at each dial: the syncer's Service name may point elsewhere after a restart.
        let tcp = match tokio::net::TcpStream::connect((host.as_str(), port)).await {
            Ok(s) => s,
            Err(e) => return fail("connect", &e),
        };
        let connector = tokio_rustls::TlsConnector::from(self.tls.clone());
        let tls = match connector.connect(self.server_name.clone(), tcp).await {
            Ok(s) => s,
            Err(e) => return fail("tls", &e),
        };
        let (mut sender, conn) =
            match hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(tls)).await
            {
                Ok(h) => h,
                Err(e) => return fail("handshake", &e),
            };
        tokio::spawn(async move {
            let _ = conn.with_upgrades().await;
        });
        let req = match Request::builder()
            .method(Method::CONNECT)
            .uri(target)
            .header(hyper::header::HOST, target)
            .body(Empty::new())
        {
            Ok(r) => r,
            Err(e) => return fail("request", &e),
        };
        let res = match sender.send_request(req).await {
            Ok(r) => r,
            Err(e) => return fail("request", &e),
        };
        if res.status() != StatusCode::OK {
            return Chained::Answered(res.status());
        }
        match hyper::upgrade::on(res).await {
            Ok(up) => Chained::Open(up),
            Err(e) => fail("upgrade", &e),
        }
    }
}

/// Answers `200` to the apiserver's CONNECT and then pipes its connection and `upstream`
/// both ways until either ends.
fn splice<U>(req: Request<Incoming>, mut upstream: U) -> Response<Body>
where
    U: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let Ok(upgraded) = hyper::upgrade::on(req).await else {
            return;
        };
        let mut apiserver = TokioIo::new(upgraded);
        let _ = tokio::io::copy_bidirectional(&mut apiserver, &mut upstream).await;
    });
    Response::new(
        Full::new(Bytes::new())
            .map_err(|never| match never {})
            .boxed_unsync(),
    )
}

/// Binds the relay's socket at `path`. A socket left there by an earlier run of the container
/// (the shared volume outlives it) is removed first; anything else at that path is an error.
pub fn bind(path: &Path) -> Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    let serve_err = |source| Error::RelaySocket {
        path: path.to_owned(),
        source,
    };
    if let Ok(meta) = std::fs::symlink_metadata(path)
        && meta.file_type().is_socket()
    {
        std::fs::remove_file(path).map_err(serve_err)?;
    }
    let listener = UnixListener::bind(path).map_err(serve_err)?;
    // Connectable by any user: the apiserver beside it runs as a user of its own (root, with
    // or without capabilities). Who reaches the socket at all is decided by who mounts its
    // volume, the two containers of the pod.
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o666))
        .map_err(serve_err)?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, UnixStream};

    /// The handshake timeout in these tests: short, so a stalled client is seen dropped.
    const TEST_HANDSHAKE: Duration = Duration::from_millis(500);

    /// Throwaway files for the chained hop: a CA and a client certificate of it.
    fn files(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
        let now = time::OffsetDateTime::now_utc();
        let ca = vcp_pki::Ca::generate("relay-test-ca", now, time::Duration::days(1)).unwrap();
        let leaf = ca
            .issue(
                &vcp_pki::LeafSpec::client(vcp_pki::KUBELET_CLIENT_USER, &[]),
                now,
                time::Duration::days(1),
            )
            .unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        (
            write("ca.crt", &ca.cert_key().cert_pem),
            write("tls.crt", &leaf.cert_pem),
            write("tls.key", &leaf.key_pem),
        )
    }

    /// A listener counting who connects and answering each with `reply`.
    async fn listener(reply: &'static [u8]) -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = count.clone();
        tokio::spawn(async move {
            while let Ok((mut c, _)) = l.accept().await {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    let n = c.read(&mut buf).await.unwrap_or(0);
                    let _ = c.write_all(reply).await;
                    let _ = c.write_all(&buf[..n]).await;
                });
            }
        });
        (addr, count)
    }

    /// A relay for a webhook at `webhook` whose syncer is at `proxy`, serving on a socket in
    /// `dir`; returns the socket's path.
    fn start(dir: &Path, webhook: SocketAddr, proxy: &str) -> std::path::PathBuf {
        let (ca, cert, key) = files(dir);
        let tls = ChainTls {
            ca: &ca,
            cert: &cert,
            key: &key,
        };
        let mut relay = Relay::new(webhook, proxy, &tls).unwrap();
        relay.handshake = TEST_HANDSHAKE;
        let relay = Arc::new(relay);
        let socket = dir.join("egress.sock");
        // A socket left over from an earlier run is replaced.
        drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
        let listener = bind(&socket).unwrap();
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&socket).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o666, "the apiserver's user may connect");
        tokio::spawn(relay.serve(listener));
        socket
    }

    /// Sends `CONNECT target` on `socket` as kube-apiserver does; the answer's head and the
    /// connection.
    async fn connect(socket: &Path, target: &str) -> (String, UnixStream) {
        let mut c = UnixStream::connect(socket).await.unwrap();
        c.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if c.read(&mut byte).await.unwrap() == 0 {
                break;
            }
            head.push(byte[0]);
        }
        (String::from_utf8_lossy(&head).into_owned(), c)
    }

    /// A port where nothing listens: the syncer, down.
    fn closed_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    #[tokio::test]
    async fn the_authorizer_is_reached_with_the_syncer_down_and_nothing_else_is() {
        let dir = tempfile::tempdir().unwrap();
        let (webhook, webhook_seen) = listener(b"webhook:").await;
        let (decoy, decoy_seen) = listener(b"SECRET:").await;
        let socket = start(
            dir.path(),
            webhook,
            &format!("https://localhost:{}", closed_port()),
        );

        let (head, mut c) = connect(&socket, &webhook.to_string()).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        c.write_all(b"ping").await.unwrap();
        let mut got = Vec::new();
        c.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"webhook:ping");
        assert_eq!(webhook_seen.load(std::sync::atomic::Ordering::SeqCst), 1);

        // The decoy is on this pod's loopback too; only the webhook's port is local.
        for target in [decoy.to_string(), format!("localhost:{}", decoy.port())] {
            let (head, mut c) = connect(&socket, &target).await;
            assert!(head.starts_with("HTTP/1.1 403"), "{target}: {head}");
            let mut body = String::new();
            c.read_to_string(&mut body).await.unwrap();
            assert!(body.contains("egress refused"), "{body}");
            assert!(!body.contains("SECRET"), "{body}");
        }
        let (head, _) = connect(&socket, "not a target").await;
        assert!(head.starts_with("HTTP/1.1 4"), "{head}");
        assert_eq!(decoy_seen.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_stalled_or_oversized_request_head_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let (webhook, _) = listener(b"").await;
        let socket = start(dir.path(), webhook, "https://localhost:1");

        // Half a request line, then nothing: the relay closes the connection once the
        // handshake time is up (the client would otherwise hold a task forever).
        let mut c = UnixStream::connect(&socket).await.unwrap();
        c.write_all(b"CONNECT 127.0.0.1:1").await.unwrap();
        let started = tokio::time::Instant::now();
        let mut rest = Vec::new();
        let read = tokio::time::timeout(TEST_HANDSHAKE * 10, c.read_to_end(&mut rest)).await;
        assert!(read.is_ok(), "a stalled client is still connected");
        assert!(
            started.elapsed() >= TEST_HANDSHAKE,
            "{:?}",
            started.elapsed()
        );

        // A head past MAX_HEAD is not read to its end.
        let mut c = UnixStream::connect(&socket).await.unwrap();
        let huge = format!(
            "CONNECT 127.0.0.1:1 HTTP/1.1\r\nX-Pad: {}\r\n\r\n",
            "a".repeat(MAX_HEAD * 2)
        );
        let _ = c.write_all(huge.as_bytes()).await;
        let mut answer = Vec::new();
        let _ = c.read_to_end(&mut answer).await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
            "{answer}"
        );
    }

    #[test]
    fn the_proxy_is_named_by_an_https_url_and_the_files_must_read() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = files(dir.path());
        let tls = ChainTls {
            ca: &ca,
            cert: &cert,
            key: &key,
        };
        let webhook: SocketAddr = "127.0.0.1:10262".parse().unwrap();
        let ok = Relay::new(webhook, "https://vcp-syncer.vcp-t1.svc:10250", &tls).unwrap();
        assert_eq!(ok.proxy, ("vcp-syncer.vcp-t1.svc".to_owned(), 10250));
        let v6 = Relay::new(webhook, "https://[::1]:10250", &tls).unwrap();
        assert_eq!(v6.proxy, ("::1".to_owned(), 10250));
        assert!(Relay::new(webhook, "http://vcp-syncer:10250", &tls).is_err());
        assert!(Relay::new(webhook, "vcp-syncer:10250", &tls).is_err());
        let missing = ChainTls {
            ca: &dir.path().join("nope.crt"),
            ..tls.clone()
        };
        assert!(Relay::new(webhook, "https://vcp-syncer:10250", &missing).is_err());
        // The key where the certificate should be: no certificate to present.
        let swapped = ChainTls {
            cert: &key,
            ..tls.clone()
        };
        assert!(Relay::new(webhook, "https://vcp-syncer:10250", &swapped).is_err());
    }
}
