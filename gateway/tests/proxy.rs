//! The gateway end to end on loopback, without Kubernetes: the real proxy with a route table
//! filled by hand, in front of two real TLS servers (rustls, certificates from a test CA made
//! with rcgen) for `a.example.test` and `b.example.test`. Clients are real rustls clients that
//! verify the backend's certificate through the gateway, or raw sockets for what no TLS client
//! sends. Time bounds are generous: they only tell "closed promptly" from "left hanging".
//!
//! Sleep mode: a small axum server on 127.0.0.1 stands in for vcp's two gateway routes
//! ([`FakeVcp`]: it checks the bearer token and records every request), and asleep tenants
//! get backends that start listening only later, on a port chosen beforehand.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use vcp_gateway::proxy::{Gateway, Limits};
use vcp_gateway::route::{Domain, RouteTable, Target, TenantKey};
use vcp_gateway::vcp::{Token, Vcp, VcpUrl};

/// How long a refused connection may take to be closed when the handshake timeout is far
/// longer (10 s): plenty for a loaded machine, far from the timeout.
const PROMPT: Duration = Duration::from_secs(3);

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The test's CA, and TLS servers whose certificates it signs.
struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    fn new() -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "gateway test ca");
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Pki { ca }
    }

    fn ca_der(&self) -> CertificateDer<'static> {
        self.ca.der().clone()
    }

    /// A TLS server for `name` that sends `id` first, then echoes.
    async fn backend(&self, name: &str, id: &'static str) -> Backend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        self.backend_on(listener, name, id)
    }

    /// [`Pki::backend`] on `listener`.
    fn backend_on(&self, listener: TcpListener, name: &str, id: &'static str) -> Backend {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .signed_by(&key, &self.ca)
            .unwrap();
        let key = PrivateKeyDer::Pkcs8(key.serialize_der().into());
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    if tls.write_all(id.as_bytes()).await.is_err() {
                        return;
                    }
                    let mut buf = [0; 1024];
                    while let Ok(n @ 1..) = tls.read(&mut buf).await {
                        if tls.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Backend { addr, accepted }
    }
}

struct Backend {
    addr: SocketAddr,
    /// TCP connections it accepted.
    accepted: Arc<AtomicUsize>,
}

impl Backend {
    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// A gateway for `*.example.test` routing `a` and `b` to their backends.
struct Harness {
    gateway: Arc<Gateway>,
    addr: SocketAddr,
    pki: Pki,
    ca: CertificateDer<'static>,
    a: Backend,
    b: Backend,
    stop: Option<oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<()>,
}

fn name(s: &str) -> TenantKey {
    TenantKey::new(s).unwrap()
}

/// Limits for tests: a handshake timeout far above [`PROMPT`] unless a test says otherwise.
fn limits() -> Limits {
    Limits {
        handshake_timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(3),
        max_connections: 100,
        drain_timeout: Duration::from_secs(10),
        wake_timeout: Duration::from_secs(30),
    }
}

impl Harness {
    async fn start(limits: Limits) -> Harness {
        Harness::start_with(limits, None).await
    }

    /// A harness whose gateway asks `vcp` to wake asleep tenants.
    async fn start_with(limits: Limits, vcp: Option<Vcp>) -> Harness {
        let pki = Pki::new();
        let a = pki.backend("a.example.test", "backend-a").await;
        let b = pki.backend("b.example.test", "backend-b").await;
        let routes = Arc::new(RouteTable::from_routes([
            (name("a"), a.addr),
            (name("b"), b.addr),
        ]));
        let domain = Domain::new("example.test").unwrap();
        let mut gateway = Gateway::new(domain, routes, limits);
        if let Some(vcp) = vcp {
            gateway = gateway.with_vcp(vcp);
        }
        let gateway = Arc::new(gateway);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(gateway.clone().serve(listener, async move {
            let _ = stopped.await;
        }));
        Harness {
            gateway,
            addr,
            ca: pki.ca_der(),
            pki,
            a,
            b,
            stop: Some(stop),
            served,
        }
    }

    fn client_config(&self) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.clone()).unwrap();
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Arc::new(config)
    }

    /// A TLS connection through the gateway to `server`, verified against the test CA.
    async fn tls(
        &self,
        server: ServerName<'static>,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(self.addr).await?;
        let connector = tokio_rustls::TlsConnector::from(self.client_config());
        within(connector.connect(server, tcp)).await
    }

    async fn tls_to(
        &self,
        host: &str,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        self.tls(ServerName::try_from(host.to_owned()).unwrap())
            .await
    }

    /// Which backend a TLS client for `host` reaches, after checking it echoes.
    async fn reach(&self, host: &str) -> String {
        let mut tls = self.tls_to(host).await.expect("a verified TLS connection");
        let id = read_id(&mut tls).await;
        echoes(&mut tls).await;
        id
    }

    /// `vcp_gateway_connections_total{outcome}`.
    fn outcomes(&self, outcome: &str) -> u64 {
        self.metric(&format!(
            "vcp_gateway_connections_total{{outcome=\"{outcome}\"}}"
        ))
    }

    /// The value of the series `series` (name and labels), 0 if absent.
    fn metric(&self, series: &str) -> u64 {
        let prefix = format!("{series} ");
        self.gateway
            .metrics
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
            .unwrap_or(0)
    }
}

/// `f`, or a panic if it hangs: a broken gateway fails the test rather than stall it.
async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .expect("no answer within 10 s")
}

async fn read_id<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> String {
    let mut id = [0; 9];
    within(s.read_exact(&mut id))
        .await
        .expect("the backend's id");
    String::from_utf8(id.to_vec()).unwrap()
}

async fn echoes<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(s: &mut S) {
    s.write_all(b"ping").await.unwrap();
    let mut back = [0; 4];
    within(s.read_exact(&mut back)).await.expect("the echo");
    assert_eq!(&back, b"ping");
}

/// Waits until the gateway closes `tcp` (end of stream or reset); how long it took.
async fn closed_within(mut tcp: TcpStream, bound: Duration) -> Duration {
    let start = Instant::now();
    let mut buf = [0; 64];
    match tokio::time::timeout(bound, tcp.read(&mut buf)).await {
        Err(_) => panic!("still open after {bound:?}"),
        Ok(Ok(0) | Err(_)) => {}
        Ok(Ok(n)) => panic!("the gateway sent {n} bytes on a refused connection"),
    }
    start.elapsed()
}

async fn eventually(what: &str, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < Duration::from_secs(5), "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A hand-made ClientHello record naming `host` (any bytes, even ones no TLS library sends).
fn hand_hello(host: &[u8]) -> Vec<u8> {
    fn vec16(data: &[u8]) -> Vec<u8> {
        let mut v = u16::try_from(data.len()).unwrap().to_be_bytes().to_vec();
        v.extend_from_slice(data);
        v
    }
    let mut entry = vec![0];
    entry.extend(vec16(host));
    let mut sni = 0u16.to_be_bytes().to_vec();
    sni.extend(vec16(&vec16(&entry)));
    let mut body = vec![3, 3];
    body.extend([7; 32]);
    body.push(0);
    body.extend(vec16(&[0x13, 0x01]));
    body.extend([1, 0]);
    body.extend(vec16(&sni));
    let len = u32::try_from(body.len()).unwrap().to_be_bytes();
    let mut handshake = vec![1, len[1], len[2], len[3]];
    handshake.extend(body);
    let mut record = vec![22, 3, 1];
    record.extend(vec16(&handshake));
    record
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tenant_reaches_its_own_apiserver_with_tls_verified_end_to_end() {
    let h = Harness::start(limits()).await;
    assert_eq!(h.reach("a.example.test").await, "backend-a");
    assert_eq!(h.reach("b.example.test").await, "backend-b");
    assert_eq!(
        h.reach("A.Example.Test").await,
        "backend-a",
        "names are case-insensitive"
    );
    assert_eq!(h.outcomes("routed"), 3);

    // The client checked the backend's certificate for the name it dialled: b's
    // certificate does not pass for a.
    let pki = Pki::new();
    let impostor = pki.backend("a.example.test", "impostor!").await;
    h.gateway.routes.set(name("a"), impostor.addr);
    let refused = h.tls_to("a.example.test").await;
    assert!(refused.is_err(), "a certificate from another CA is refused");
    h.gateway.routes.set(name("a"), h.b.addr);
    assert!(
        h.tls_to("a.example.test").await.is_err(),
        "b's certificate does not name a"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activity_records_a_tenants_open_connections() {
    let h = Harness::start(limits()).await;
    assert_eq!(h.gateway.activity.get("a"), None);
    let mut tls = h.tls_to("a.example.test").await.unwrap();
    read_id(&mut tls).await;
    let during = h.gateway.activity.get("a").expect("a was active");
    assert_eq!(during.open, 1);
    drop(tls);
    eventually("the connection ended", || {
        h.gateway.activity.get("a").is_some_and(|a| a.open == 0)
    })
    .await;
    assert!(h.gateway.activity.get("a").unwrap().last >= during.last);
    assert_eq!(h.gateway.activity.get("b"), None);
    assert!(
        h.gateway
            .metrics
            .encode()
            .contains("vcp_gateway_routed_connections_total{tenant=\"a\"} 1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_name_is_closed_promptly() {
    let h = Harness::start(limits()).await;
    for host in [
        "c.example.test",
        "a.example.org",
        "x.a.example.test",
        "1a.example.test",
    ] {
        let start = Instant::now();
        let attempt = tokio::time::timeout(PROMPT, h.tls_to(host)).await;
        let refused = attempt.unwrap_or_else(|_| panic!("{host}: still open after {PROMPT:?}"));
        assert!(refused.is_err(), "{host} was served");
        assert!(start.elapsed() < PROMPT);
    }
    assert_eq!(h.outcomes("unknown"), 4);
    assert_eq!(h.a.accepted() + h.b.accepted(), 0, "no backend saw them");
    assert!(!h.gateway.metrics.encode().contains("tenant=\"c\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_hello_without_a_server_name_is_closed() {
    let h = Harness::start(limits()).await;
    let ip = ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
    let attempt = tokio::time::timeout(PROMPT, h.tls(ip))
        .await
        .expect("closed promptly");
    assert!(attempt.is_err());
    assert_eq!(h.outcomes("no_sni"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_300_character_name_and_other_protocols_are_closed() {
    let h = Harness::start(limits()).await;
    let long = format!("{}.example.test", "a".repeat(287));
    assert_eq!(long.len(), 300);
    let mut tcp = TcpStream::connect(h.addr).await.unwrap();
    tcp.write_all(&hand_hello(long.as_bytes())).await.unwrap();
    closed_within(tcp, PROMPT).await;

    let mut tcp = TcpStream::connect(h.addr).await.unwrap();
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: a.example.test\r\n\r\n")
        .await
        .unwrap();
    closed_within(tcp, PROMPT).await;
    assert_eq!(h.outcomes("invalid"), 2);

    // The hand-made hello itself is routable when its name is: the refusal was the name's.
    let mut tcp = TcpStream::connect(h.addr).await.unwrap();
    tcp.write_all(&hand_hello(b"a.example.test")).await.unwrap();
    eventually("routed to a", || h.outcomes("routed") == 1).await;
    eventually("a accepted the connection", || h.a.accepted() == 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_is_closed_at_the_handshake_timeout_while_others_are_served() {
    let h = Harness::start(Limits {
        handshake_timeout: Duration::from_secs(1),
        ..limits()
    })
    .await;
    // A real ClientHello, one byte every 200 ms: never complete within the second.
    let hello = {
        let mut out = Vec::new();
        let config = h.client_config();
        let server = ServerName::try_from("a.example.test").unwrap();
        let mut conn = rustls::ClientConnection::new(config, server).unwrap();
        while conn.wants_write() {
            conn.write_tls(&mut out).unwrap();
        }
        out
    };
    let (mut read, mut write) = TcpStream::connect(h.addr).await.unwrap().into_split();
    let started = Instant::now();
    let dribble = tokio::spawn(async move {
        for b in hello {
            if write.write_all(&[b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let closed = tokio::spawn(async move {
        let mut buf = [0; 16];
        let ended = matches!(read.read(&mut buf).await, Ok(0) | Err(_));
        (ended, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        h.reach("b.example.test").await,
        "backend-b",
        "served meanwhile"
    );
    let (ended, after) = tokio::time::timeout(Duration::from_secs(1) + PROMPT, closed)
        .await
        .expect("closed within the timeout and a margin")
        .unwrap();
    assert!(ended, "closed without a byte sent back");
    assert!(after < Duration::from_secs(1) + PROMPT);
    assert_eq!(h.outcomes("timeout"), 1);
    assert_eq!(h.a.accepted(), 0);
    dribble.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_route_refuses_new_connections() {
    let h = Harness::start(limits()).await;
    let mut open = h.tls_to("a.example.test").await.unwrap();
    assert_eq!(read_id(&mut open).await, "backend-a");
    assert!(h.gateway.routes.remove("a").is_some());
    let attempt = tokio::time::timeout(PROMPT, h.tls_to("a.example.test"))
        .await
        .expect("closed promptly");
    assert!(
        attempt.is_err(),
        "a new connection to a deleted tenant is refused"
    );
    assert_eq!(h.a.accepted(), 1);
    assert_eq!(h.outcomes("unknown"), 1);
    assert_eq!(h.reach("b.example.test").await, "backend-b");
    // A connection made before the deletion is not cut by it.
    echoes(&mut open).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_limit_are_closed_at_once() {
    let h = Harness::start(Limits {
        max_connections: 1,
        ..limits()
    })
    .await;
    let mut held = h.tls_to("a.example.test").await.unwrap();
    read_id(&mut held).await;
    let over = TcpStream::connect(h.addr).await.unwrap();
    closed_within(over, PROMPT).await;
    assert_eq!(h.outcomes("over_limit"), 1);
    drop(held);
    eventually("the held connection ended", || {
        h.gateway.open_connections() == 0
    })
    .await;
    assert_eq!(h.reach("b.example.test").await, "backend-b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_apiserver_closes_the_connection() {
    let h = Harness::start(limits()).await;
    let gone = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = gone.local_addr().unwrap();
    drop(gone);
    h.gateway.routes.set(name("a"), addr);
    let attempt = tokio::time::timeout(PROMPT, h.tls_to("a.example.test"))
        .await
        .expect("closed promptly");
    assert!(attempt.is_err());
    assert_eq!(h.outcomes("backend_unreachable"), 1);
    assert_eq!(h.outcomes("routed"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_accepting_and_lets_open_connections_finish() {
    let mut h = Harness::start(limits()).await;
    let mut open = h.tls_to("a.example.test").await.unwrap();
    read_id(&mut open).await;
    h.stop.take().unwrap().send(()).unwrap();
    let refused = async {
        while TcpStream::connect(h.addr).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(PROMPT, refused)
        .await
        .expect("the listener closes");
    echoes(&mut open).await;
    assert!(!h.served.is_finished(), "it waits for the open connection");
    drop(open);
    tokio::time::timeout(PROMPT, &mut h.served)
        .await
        .expect("done once the last connection ended")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_after_shutdown_is_bounded() {
    let mut h = Harness::start(Limits {
        drain_timeout: Duration::from_millis(300),
        ..limits()
    })
    .await;
    let mut open = h.tls_to("b.example.test").await.unwrap();
    read_id(&mut open).await;
    h.stop.take().unwrap().send(()).unwrap();
    tokio::time::timeout(PROMPT, &mut h.served)
        .await
        .expect("done at the drain timeout, connection or not")
        .unwrap();
    drop(open);
}

/// The status code and body of `GET path` on `addr` (HTTP/1.1, by hand: no client needed).
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    within(tcp.read_to_string(&mut response)).await.unwrap();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_waits_for_the_route_table_and_metrics_are_served() {
    let routes = Arc::new(RouteTable::new());
    let metrics = Arc::new(vcp_gateway::metrics::Metrics::new());
    metrics.outcome(vcp_gateway::metrics::Outcome::Unknown);
    let ready = {
        let routes = routes.clone();
        move || routes.is_synced()
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = vcp_gateway::metrics::router(metrics, ready);
    tokio::spawn(async move { axum::serve(listener, router).await });
    assert_eq!(get(addr, "/healthz").await.0, 200);
    assert_eq!(get(addr, "/readyz").await.0, 503);
    routes.mark_synced();
    assert_eq!(get(addr, "/readyz").await.0, 200);
    let (status, text) = get(addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        text.contains("vcp_gateway_connections_total{outcome=\"unknown\"} 1"),
        "{text}"
    );
}

// ---- Sleep mode ----

/// The stand-in's token; the gateway sends it as `Authorization: Bearer`.
const TOKEN: &str = "gateway-test-token";

/// One activity report as the stand-in saw it.
#[derive(Debug, Clone)]
struct Report {
    /// The keys in the order sent.
    keys: Vec<String>,
    /// Every `at`, as sent.
    ats: Vec<String>,
    /// What the stand-in answered.
    status: u16,
}

/// vcp's two gateway routes on 127.0.0.1: checks the bearer token, records what it was sent,
/// answers 404 to wakes of `unknown` keys and 500 to reports while `failing`.
#[derive(Clone, Default)]
struct FakeVcp {
    wakes: Arc<Mutex<Vec<String>>>,
    reports: Arc<Mutex<Vec<Report>>>,
    unknown: Arc<Mutex<HashSet<String>>>,
    failing: Arc<AtomicBool>,
    unauthorized: Arc<AtomicUsize>,
    addr: Option<SocketAddr>,
}

impl FakeVcp {
    async fn start() -> FakeVcp {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let fake = FakeVcp {
            addr: Some(listener.local_addr().unwrap()),
            ..FakeVcp::default()
        };
        let router = axum::Router::new()
            .route("/v1/gateway/wake", axum::routing::post(fake_wake))
            .route("/v1/gateway/activity", axum::routing::post(fake_activity))
            .with_state(fake.clone());
        tokio::spawn(async move { axum::serve(listener, router).await });
        fake
    }

    /// A client of this stand-in, with `token`.
    fn client_with(&self, token: &str) -> Vcp {
        let url = VcpUrl::new(&format!("http://{}", self.addr.unwrap())).unwrap();
        Vcp::new(url, Token::unchecked(token)).unwrap()
    }

    fn client(&self) -> Vcp {
        self.client_with(TOKEN)
    }

    fn wakes(&self) -> Vec<String> {
        self.wakes.lock().unwrap().clone()
    }

    fn reports(&self) -> Vec<Report> {
        self.reports.lock().unwrap().clone()
    }
}

fn authorized(fake: &FakeVcp, headers: &HeaderMap) -> bool {
    let ok = headers
        .get("authorization")
        .is_some_and(|v| v.as_bytes() == format!("Bearer {TOKEN}").as_bytes());
    if !ok {
        fake.unauthorized.fetch_add(1, Ordering::SeqCst);
    }
    ok
}

async fn fake_wake(
    State(fake): State<FakeVcp>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    if !authorized(&fake, &headers) {
        return (StatusCode::UNAUTHORIZED, Json(json!({})));
    }
    let key = body["key"].as_str().unwrap_or_default().to_owned();
    fake.wakes.lock().unwrap().push(key.clone());
    if fake.unknown.lock().unwrap().contains(&key) {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"title": "no such tenant"})),
        );
    }
    (StatusCode::ACCEPTED, Json(json!({"woken": true})))
}

async fn fake_activity(
    State(fake): State<FakeVcp>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    if !authorized(&fake, &headers) {
        return (StatusCode::UNAUTHORIZED, Json(json!({})));
    }
    let tenants = body["tenants"].as_array().cloned().unwrap_or_default();
    let field = |f: &str| -> Vec<String> {
        let value = |t: &Value| t[f].as_str().unwrap_or_default().to_owned();
        tenants.iter().map(value).collect()
    };
    let status = if fake.failing.load(Ordering::SeqCst) {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    };
    fake.reports.lock().unwrap().push(Report {
        keys: field("key"),
        ats: field("at"),
        status: status.as_u16(),
    });
    (status, Json(json!({"moved": tenants.len()})))
}

/// An address on loopback nothing listens on (yet): its dials are refused.
async fn free_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

/// A harness with an asleep tenant `s` whose apiserver will listen on the returned address.
async fn with_asleep_tenant(limits: Limits, vcp: Option<Vcp>) -> (Harness, SocketAddr) {
    let h = Harness::start_with(limits, vcp).await;
    let addr = free_addr().await;
    h.gateway.routes.set(name("s"), Target::asleep(addr));
    (h, addr)
}

/// Starts `s`'s apiserver on `addr`.
async fn wake_up(h: &Harness, addr: SocketAddr) -> Backend {
    let listener = TcpListener::bind(addr).await.unwrap();
    h.pki.backend_on(listener, "s.example.test", "backend-s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asleep_tenant_is_woken_once_and_every_waiting_client_gets_through() {
    let vcp = FakeVcp::start().await;
    let (h, addr) = with_asleep_tenant(limits(), Some(vcp.client())).await;
    let h = Arc::new(h);
    let clients: Vec<_> = (0..5)
        .map(|_| {
            let h = h.clone();
            tokio::spawn(async move {
                let mut tls = h
                    .tls_to("s.example.test")
                    .await
                    .expect("a verified TLS connection");
                let id = read_id(&mut tls).await;
                echoes(&mut tls).await;
                id
            })
        })
        .collect();
    eventually("vcp was asked to wake s", || vcp.wakes() == ["s"]).await;
    eventually("every client is held", || {
        h.gateway.activity.get("s").is_some_and(|a| a.open == 5)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        clients.iter().all(|c| !c.is_finished()),
        "held while asleep"
    );
    let backend = wake_up(&h, addr).await;
    for client in clients {
        assert_eq!(within(client).await.unwrap(), "backend-s");
    }
    assert_eq!(vcp.wakes(), ["s"], "one wake for five clients");
    assert_eq!(backend.accepted(), 5);
    assert_eq!(h.outcomes("routed"), 5);
    assert_eq!(h.metric("vcp_gateway_wakes_total{result=\"requested\"}"), 1);
    assert_eq!(h.metric("vcp_gateway_wake_wait_seconds_count"), 5);
    assert_eq!(vcp.unauthorized.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_answered_not_found_closes_the_connection_at_once() {
    let vcp = FakeVcp::start().await;
    vcp.unknown.lock().unwrap().insert("s".into());
    let (h, _) = with_asleep_tenant(limits(), Some(vcp.client())).await;
    let mut tcp = TcpStream::connect(h.addr).await.unwrap();
    tcp.write_all(&hand_hello(b"s.example.test")).await.unwrap();
    let took = closed_within(tcp, PROMPT).await;
    assert!(took < PROMPT, "not held for the 30 s wake timeout");
    assert_eq!(vcp.wakes(), ["s"]);
    assert_eq!(h.outcomes("unknown"), 1);
    assert_eq!(h.metric("vcp_gateway_wakes_total{result=\"not_found\"}"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_timeout_closes_the_connection_after_about_the_timeout() {
    let vcp = FakeVcp::start().await;
    let timeout = Duration::from_millis(1500);
    let limits = Limits {
        wake_timeout: timeout,
        ..limits()
    };
    let (h, _never) = with_asleep_tenant(limits, Some(vcp.client())).await;
    let mut tcp = TcpStream::connect(h.addr).await.unwrap();
    let start = Instant::now();
    tcp.write_all(&hand_hello(b"s.example.test")).await.unwrap();
    closed_within(tcp, timeout + PROMPT).await;
    let took = start.elapsed();
    assert!(
        took >= timeout - Duration::from_millis(100),
        "closed after {took:?}"
    );
    assert_eq!(h.outcomes("wake_timeout"), 1);
    assert_eq!(h.outcomes("routed"), 0);
    assert_eq!(vcp.wakes(), ["s"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_wake_still_waits_for_the_apiserver() {
    // vcp unreachable: another replica or the owner may wake the tenant.
    let nobody = VcpUrl::new(&format!("http://{}", free_addr().await)).unwrap();
    let vcp = Vcp::new(nobody, Token::unchecked(TOKEN)).unwrap();
    let (h, addr) = with_asleep_tenant(limits(), Some(vcp)).await;
    let h = Arc::new(h);
    let client = tokio::spawn({
        let h = h.clone();
        async move { h.reach("s.example.test").await }
    });
    eventually("the wake failed", || {
        h.metric("vcp_gateway_wakes_total{result=\"failed\"}") == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!client.is_finished(), "still held");
    wake_up(&h, addr).await;
    assert_eq!(within(client).await.unwrap(), "backend-s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_refused_by_vcp_and_the_gateway_keeps_serving() {
    let vcp = FakeVcp::start().await;
    let (h, addr) = with_asleep_tenant(limits(), Some(vcp.client_with("wrong"))).await;
    let h = Arc::new(h);
    let client = tokio::spawn({
        let h = h.clone();
        async move { h.reach("s.example.test").await }
    });
    eventually("vcp refused the token", || {
        vcp.unauthorized.load(Ordering::SeqCst) == 1
    })
    .await;
    wake_up(&h, addr).await;
    assert_eq!(within(client).await.unwrap(), "backend-s");
    assert_eq!(h.metric("vcp_gateway_wakes_total{result=\"failed\"}"), 1);
    assert_eq!(h.reach("a.example.test").await, "backend-a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_that_wakes_while_a_client_waits_is_followed() {
    let vcp = FakeVcp::start().await;
    let (h, _never) = with_asleep_tenant(limits(), Some(vcp.client())).await;
    let h = Arc::new(h);
    let client = tokio::spawn({
        let h = h.clone();
        async move { h.reach("s.example.test").await }
    });
    eventually("vcp was asked to wake s", || vcp.wakes() == ["s"]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The watch: s is awake now, on another address.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = h.pki.backend_on(listener, "s.example.test", "backend-s");
    h.gateway.routes.set(name("s"), backend.addr);
    assert_eq!(within(client).await.unwrap(), "backend-s");
    assert_eq!(backend.accepted(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_awake_route_whose_dial_is_refused_fails_at_once() {
    let vcp = FakeVcp::start().await;
    let h = Harness::start_with(limits(), Some(vcp.client())).await;
    h.gateway.routes.set(name("a"), free_addr().await);
    let mut tcp = TcpStream::connect(h.addr).await.unwrap();
    tcp.write_all(&hand_hello(b"a.example.test")).await.unwrap();
    let took = closed_within(tcp, PROMPT).await;
    assert!(took < PROMPT, "not held for the 30 s wake timeout");
    assert_eq!(h.outcomes("backend_unreachable"), 1);
    assert!(vcp.wakes().is_empty(), "an awake tenant is not woken");
}

/// The keys of every report the stand-in answered with `status`, one list per report.
fn reported(vcp: &FakeVcp, status: u16) -> Vec<Vec<String>> {
    let reports = vcp.reports();
    reports
        .into_iter()
        .filter(|r| r.status == status)
        .map(|r| r.keys)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activity_reports_name_the_tenants_that_had_connections() {
    let vcp = FakeVcp::start().await;
    let h = Harness::start_with(limits(), Some(vcp.client())).await;
    let every = Duration::from_millis(200);
    let reporter = tokio::spawn(vcp_gateway::activity::run(
        vcp.client(),
        h.gateway.activity.clone(),
        h.gateway.metrics.clone(),
        every,
    ));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(vcp.reports().is_empty(), "nothing seen, nothing sent");
    let mut open = h.tls_to("a.example.test").await.unwrap();
    read_id(&mut open).await;
    assert_eq!(h.reach("b.example.test").await, "backend-b");
    eventually("a and b were reported", || {
        let named: HashSet<String> = reported(&vcp, 200).into_iter().flatten().collect();
        named.contains("a") && named.contains("b")
    })
    .await;
    // Still open, a is named in every report; c never had a connection.
    let before = vcp.reports().len();
    eventually("two more reports", || vcp.reports().len() >= before + 2).await;
    for r in &vcp.reports()[before..] {
        assert!(r.keys.contains(&"a".to_owned()), "{r:?}");
    }
    for r in vcp.reports() {
        assert!(!r.keys.contains(&"c".to_owned()));
        let unique: HashSet<&String> = r.keys.iter().collect();
        assert_eq!(unique.len(), r.keys.len(), "each key once: {r:?}");
        for at in &r.ats {
            assert!(
                at.contains('T') && at.ends_with('Z'),
                "RFC 3339 in UTC: {at}"
            );
        }
    }
    // Once closed and reported, a quiet gateway sends nothing.
    drop(open);
    eventually("a closed", || {
        h.gateway.activity.get("a").is_some_and(|a| a.open == 0)
    })
    .await;
    tokio::time::sleep(every * 3).await;
    let settled = vcp.reports().len();
    tokio::time::sleep(every * 4).await;
    assert_eq!(vcp.reports().len(), settled, "empty reports are skipped");
    assert_eq!(vcp.unauthorized.load(Ordering::SeqCst), 0);
    reporter.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_activity_report_is_retried_with_the_same_tenants() {
    let vcp = FakeVcp::start().await;
    vcp.failing.store(true, Ordering::SeqCst);
    let h = Harness::start_with(limits(), Some(vcp.client())).await;
    let every = Duration::from_millis(200);
    let reporter = tokio::spawn(vcp_gateway::activity::run(
        vcp.client(),
        h.gateway.activity.clone(),
        h.gateway.metrics.clone(),
        every,
    ));
    assert_eq!(h.reach("a.example.test").await, "backend-a");
    eventually("a closed", || {
        h.gateway.activity.get("a").is_some_and(|a| a.open == 0)
    })
    .await;
    // Once a is closed, it is seen in at most one more report; any later one names it only
    // because the failed one was kept.
    let failed = reported(&vcp, 500).len();
    eventually("three more failed reports", || {
        reported(&vcp, 500).len() >= failed + 3
    })
    .await;
    let failures = reported(&vcp, 500);
    assert!(failures.iter().all(|keys| keys == &["a"]), "{failures:?}");
    vcp.failing.store(false, Ordering::SeqCst);
    eventually("a delivered", || !reported(&vcp, 200).is_empty()).await;
    assert_eq!(reported(&vcp, 200), [["a"]]);
    // Delivered, it is not sent again.
    tokio::time::sleep(every * 4).await;
    assert_eq!(reported(&vcp, 200), [["a"]]);
    assert!(h.metric("vcp_gateway_activity_reports_total{result=\"failed\"}") >= 3);
    reporter.abort();
}
