//! The TLS port: accept, read the ClientHello, route by its server name, splice.
//!
//! Data flow, per connection ([`Gateway::serve`] accepts, one task each):
//! 1. A permit from the connection limit, or the connection is closed at once (`over_limit`).
//! 2. Reads until [`sni::parse`] gives a verdict, all of it within the handshake timeout: a
//!    client dribbling bytes is cut off when the time is up, however much it still sends.
//! 3. The name goes through [`route::tenant_of`] and the [`RouteTable`]. A refusal (no name, a
//!    stream that is not TLS, a name that is no tenant's) closes the connection at once with no
//!    TLS alert (the gateway speaks no TLS), is logged at info with its reason and is counted.
//! 4. An awake route: one dial of the tenant's Service within the connect timeout; a refusal
//!    or a timeout closes the connection (`backend_unreachable`), since an awake apiserver that
//!    refuses will not accept a moment later either.
//!    An asleep route (its Service has no endpoints): [`crate::wake`] asks vcp to wake the
//!    tenant (one request per tenant per two seconds, shared by every connection meanwhile)
//!    while the connection is held and the route's *current* backend dialled every
//!    [`DIAL_EVERY`] until one dial is accepted or the wake timeout passes (`wake_timeout`). The
//!    route is read again before each dial: the watch may flip it awake, or move it, meanwhile.
//!    vcp answering that no tenant has the key closes the connection at once; vcp failing to
//!    answer does not (another replica, or the owner, may be waking it).
//! 5. The bytes already read are written to the backend first, then both directions copied
//!    until either side ends. TLS runs end to end between the client and the tenant
//!    apiserver; the gateway holds no key.
//!
//! Each tenant's [`Activity`] (last accepted or ended connection, connections open, waiting
//! ones included) is kept for sleep mode: [`crate::activity`] reports it to vcp. On shutdown
//! the listener closes and open connections get a bounded time to finish.

pub use crate::activity::{Activity, TenantActivity};
use crate::metrics::{Direction, Metrics, Outcome};
use crate::route::{self, Domain, Route, RouteTable, TenantKey};
use crate::sni::{self, ClientHello};
use crate::vcp::Vcp;
use crate::wake::{Answer, Wakes};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The gateway's time and connection limits.
#[derive(Debug, Clone)]
pub struct Limits {
    /// From accept until the ClientHello is complete.
    pub handshake_timeout: Duration,
    /// For the connection to a tenant's apiserver.
    pub connect_timeout: Duration,
    /// Connections open at once; more are closed as they come.
    pub max_connections: u32,
    /// How long open connections may go on after shutdown begins.
    pub drain_timeout: Duration,
    /// How long a connection for an asleep tenant is held, once its ClientHello is read, for
    /// the tenant's apiserver to accept.
    pub wake_timeout: Duration,
}

/// How often a connection waiting for an asleep tenant dials its backend.
pub const DIAL_EVERY: Duration = Duration::from_millis(200);
/// Bound on one dial while waiting for a wake. An apiserver that is up accepts in
/// milliseconds; a dial that hangs (no endpoints, a SYN dropped) would otherwise hold its
/// retries back for the whole connect timeout, and a retransmitted SYN keeps the flow the
/// first one had, so it is better to dial afresh.
const WAKE_DIAL_TIMEOUT: Duration = Duration::from_secs(1);

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            handshake_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(3),
            max_connections: 10_000,
            drain_timeout: Duration::from_secs(20),
            wake_timeout: Duration::from_secs(30),
        }
    }
}

/// Marks a tenant's connection ended, however the task ends.
struct Open {
    activity: Activity,
    tenant: TenantKey,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.activity.closed(self.tenant.as_str());
    }
}

/// Keeps the open-connections gauge right, however the task ends.
struct Active(Gauge);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The SNI router: its domain, limits, routes, and what it records.
#[derive(Debug)]
pub struct Gateway {
    domain: Domain,
    limits: Limits,
    /// Where each tenant's connections go; filled by [`crate::table`] or by hand.
    pub routes: Arc<RouteTable>,
    pub activity: Activity,
    pub metrics: Arc<Metrics>,
    /// Wake requests for asleep tenants (none are made without [`Gateway::with_vcp`]).
    pub wakes: Arc<Wakes>,
    permits: Arc<Semaphore>,
}

/// A connection closed without being routed: its outcome, why, and the name it asked for.
struct Refusal {
    outcome: Outcome,
    reason: String,
    name: Option<String>,
    /// Logged at debug only: a TCP probe (a load balancer's health check) that connects and
    /// closes is not worth a line each.
    quiet: bool,
}

impl Refusal {
    fn new(outcome: Outcome, reason: impl Into<String>) -> Refusal {
        Refusal {
            outcome,
            reason: reason.into(),
            name: None,
            quiet: false,
        }
    }

    fn named(outcome: Outcome, reason: impl ToString, name: &str) -> Refusal {
        Refusal {
            outcome,
            reason: reason.to_string(),
            name: Some(sni::sanitize(name.as_bytes())),
            quiet: false,
        }
    }
}

impl Gateway {
    /// A gateway that asks nobody to wake asleep tenants: their connections wait for the
    /// backend and fail at the wake timeout.
    pub fn new(domain: Domain, routes: Arc<RouteTable>, limits: Limits) -> Gateway {
        let metrics = Arc::new(Metrics::new());
        Gateway {
            domain,
            permits: Arc::new(Semaphore::new(limits.max_connections as usize)),
            limits,
            routes,
            activity: Activity::default(),
            wakes: Arc::new(Wakes::new(None, metrics.clone())),
            metrics,
        }
    }

    /// Asks `vcp` to wake asleep tenants when connections arrive for them.
    pub fn with_vcp(mut self, vcp: Vcp) -> Gateway {
        self.wakes = Arc::new(Wakes::new(Some(vcp), self.metrics.clone()));
        self
    }

    /// Accepts connections on `listener` until `shutdown` completes, then closes the listener
    /// and waits up to the drain timeout for open connections to end. Connections still open
    /// after that are the caller's to end (the process exits, and they with it).
    pub async fn serve(self: Arc<Self>, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                () = &mut shutdown => break,
                a = listener.accept() => a,
            };
            let arrived = Instant::now();
            let (stream, peer) = match accepted {
                Ok(a) => a,
                Err(error) => {
                    // Out of file descriptors, typically: give open connections a moment to
                    // release some rather than spin.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(permit) = self.permits.clone().try_acquire_owned() else {
                // Dropping the stream closes it. Debug, not info: at the limit this fires for
                // every connection, and the counter says it.
                self.metrics.outcome(Outcome::OverLimit);
                tracing::debug!(%peer, "connection refused: at the connection limit");
                continue;
            };
            tokio::spawn(self.clone().connection(stream, peer, arrived, permit));
        }
        drop(listener);
        tracing::info!(
            open = self.open_connections(),
            "stopped accepting; waiting for open connections to end"
        );
        // Every permit back means every connection task has ended.
        let all = self.permits.acquire_many(self.limits.max_connections);
        match tokio::time::timeout(self.limits.drain_timeout, all).await {
            Ok(_) => tracing::info!("all connections ended"),
            Err(_) => tracing::warn!(
                open = self.open_connections(),
                "drain timeout; leaving the rest to be closed"
            ),
        }
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        self.limits.max_connections as usize - self.permits.available_permits()
    }

    async fn connection(
        self: Arc<Self>,
        mut client: TcpStream,
        peer: SocketAddr,
        arrived: Instant,
        _permit: OwnedSemaphorePermit,
    ) {
        let active = self.metrics.active();
        active.inc();
        let _active = Active(active);
        // Small writes (a kubectl request, a watch event) go out at once.
        let _ = client.set_nodelay(true);
        let mut hello = Vec::new();
        let (tenant, route) = match self.admit(&mut client, &mut hello).await {
            Ok(routed) => routed,
            Err(refusal) => return self.refuse(peer, refusal),
        };
        // A connection waiting for a wake is activity too: the tenant is wanted.
        self.activity.opened(&tenant);
        let _open = Open {
            activity: self.activity.clone(),
            tenant: tenant.clone(),
        };
        let upstream = if route.asleep {
            self.wake_and_dial(peer, &tenant, arrived).await
        } else {
            self.dial(peer, &tenant, route.backend).await
        };
        if let Some(upstream) = upstream {
            self.splice(client, upstream, peer, &tenant, &hello).await;
        }
    }

    /// Reads the ClientHello into `hello` and finds the route of the tenant it names.
    async fn admit(
        &self,
        client: &mut TcpStream,
        hello: &mut Vec<u8>,
    ) -> Result<(TenantKey, Route), Refusal> {
        let started = Instant::now();
        let read = tokio::time::timeout(self.limits.handshake_timeout, read_hello(client, hello));
        let verdict = read.await.map_err(|_| {
            Refusal::new(
                Outcome::Timeout,
                "no complete client hello within the handshake timeout",
            )
        })?;
        self.metrics.handshake(started.elapsed());
        let name = match verdict {
            Ok(Ok(ClientHello::ServerName(name))) => name,
            Ok(Ok(ClientHello::NoServerName)) => {
                return Err(Refusal::new(
                    Outcome::NoSni,
                    "client hello without a server name",
                ));
            }
            Ok(Ok(ClientHello::NeedMore)) if hello.is_empty() => {
                return Err(Refusal {
                    quiet: true,
                    ..Refusal::new(Outcome::Invalid, "closed before sending anything")
                });
            }
            Ok(Ok(ClientHello::NeedMore)) => {
                return Err(Refusal::new(
                    Outcome::Invalid,
                    "closed before the client hello was complete",
                ));
            }
            Ok(Err(invalid)) => return Err(Refusal::new(Outcome::Invalid, invalid.to_string())),
            Err(error) => {
                return Err(Refusal::new(
                    Outcome::Invalid,
                    format!("reading the client hello failed: {error}"),
                ));
            }
        };
        let tenant = route::tenant_of(&name, &self.domain)
            .map_err(|r| Refusal::named(Outcome::Unknown, r, &name))?;
        let route = self
            .routes
            .get(tenant.as_str())
            .ok_or_else(|| Refusal::named(Outcome::Unknown, "no route to this tenant", &name))?;
        Ok((tenant, route))
    }

    fn refuse(&self, peer: SocketAddr, refusal: Refusal) {
        let Refusal {
            outcome,
            reason,
            name,
            quiet,
        } = refusal;
        self.metrics.outcome(outcome);
        let name = name.unwrap_or_default();
        let outcome = outcome.as_str();
        if quiet {
            tracing::debug!(%peer, outcome, reason, "connection refused");
        } else {
            tracing::info!(%peer, outcome, reason, name, "connection refused");
        }
    }

    /// An awake tenant's backend: one dial within the connect timeout.
    async fn dial(
        &self,
        peer: SocketAddr,
        tenant: &TenantKey,
        backend: SocketAddr,
    ) -> Option<TcpStream> {
        let connect =
            tokio::time::timeout(self.limits.connect_timeout, TcpStream::connect(backend));
        match connect.await {
            Ok(Ok(s)) => Some(s),
            Ok(Err(e)) => {
                self.unreachable(peer, tenant, backend, &e.to_string());
                None
            }
            Err(_) => {
                self.unreachable(peer, tenant, backend, "connect timeout");
                None
            }
        }
    }

    /// An asleep tenant's backend: asks vcp to wake the tenant and dials until the backend
    /// accepts, vcp says no tenant has the key, or the wake timeout passes.
    async fn wake_and_dial(
        &self,
        peer: SocketAddr,
        tenant: &TenantKey,
        arrived: Instant,
    ) -> Option<TcpStream> {
        let ticket = self.wakes.wake(tenant);
        let not_found = async {
            if ticket.answer().await != Answer::NotFound {
                std::future::pending::<()>().await;
            }
        };
        let dialled =
            tokio::time::timeout(self.limits.wake_timeout, self.dial_until_accepted(tenant));
        let refused = |outcome, reason: &str| {
            self.refuse(peer, Refusal::named(outcome, reason, tenant.as_str()));
            None
        };
        tokio::select! {
            // A backend that accepted is served, whatever vcp said meanwhile.
            biased;
            dialled = dialled => match dialled {
                Ok(Some((upstream, backend))) => {
                    let wait = arrived.elapsed();
                    self.metrics.wake_wait(wait);
                    if ticket.first_through() {
                        let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
                        tracing::info!(tenant = %tenant, %backend, wait_ms, "tenant woke: its apiserver accepted");
                    }
                    Some(upstream)
                }
                Ok(None) => refused(Outcome::Unknown, "the route went while waiting for the wake"),
                Err(_) => refused(
                    Outcome::WakeTimeout,
                    "the asleep tenant's apiserver did not accept within the wake timeout",
                ),
            },
            () = not_found => refused(Outcome::Unknown, "vcp knows no live tenant with this key"),
        }
    }

    /// Dials the tenant's current backend every [`DIAL_EVERY`] until one dial is accepted;
    /// `None` if the route goes. Refusals are expected here (no endpoints yet) and not logged
    /// but at trace.
    async fn dial_until_accepted(&self, tenant: &TenantKey) -> Option<(TcpStream, SocketAddr)> {
        loop {
            let next = tokio::time::Instant::now() + DIAL_EVERY;
            let backend = self.routes.get(tenant.as_str())?.backend;
            let timeout = self.limits.connect_timeout.min(WAKE_DIAL_TIMEOUT);
            match tokio::time::timeout(timeout, TcpStream::connect(backend)).await {
                Ok(Ok(upstream)) => return Some((upstream, backend)),
                Ok(Err(error)) => tracing::trace!(%tenant, %backend, %error, "not accepting yet"),
                Err(_) => tracing::trace!(%tenant, %backend, "not accepting yet: dial timeout"),
            }
            tokio::time::sleep_until(next).await;
        }
    }

    /// Sends the backend the ClientHello already read, then copies both ways until either
    /// side ends.
    async fn splice(
        &self,
        client: TcpStream,
        upstream: TcpStream,
        peer: SocketAddr,
        tenant: &TenantKey,
        hello: &[u8],
    ) {
        let _ = upstream.set_nodelay(true);
        self.metrics.outcome(Outcome::Routed);
        self.metrics.routed(tenant);
        let backend = upstream.peer_addr().ok();
        tracing::debug!(%peer, %tenant, ?backend, "routed");
        let to_backend = self.metrics.bytes(Direction::ToBackend);
        let mut client = Counted {
            inner: client,
            read: to_backend.clone(),
        };
        let mut upstream = Counted {
            inner: upstream,
            read: self.metrics.bytes(Direction::ToClient),
        };
        if let Err(error) = upstream.inner.write_all(hello).await {
            tracing::debug!(%peer, %tenant, %error, "writing the client hello failed");
            return;
        }
        to_backend.inc_by(hello.len() as u64);
        match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
            Ok((up, down)) => tracing::debug!(%peer, %tenant, up, down, "connection ended"),
            Err(error) => tracing::debug!(%peer, %tenant, %error, "connection ended"),
        }
    }

    fn unreachable(&self, peer: SocketAddr, tenant: &TenantKey, backend: SocketAddr, error: &str) {
        self.metrics.outcome(Outcome::BackendUnreachable);
        tracing::warn!(%peer, %tenant, %backend, error, "tenant apiserver unreachable");
    }
}

/// Reads from `client` into `buf` until the ClientHello parser has a verdict; `NeedMore` if
/// the client closed first. `buf` never grows past the parser's cap and one read.
async fn read_hello(
    client: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> io::Result<Result<ClientHello, sni::Invalid>> {
    loop {
        buf.reserve(4096);
        if client.read_buf(buf).await? == 0 {
            return Ok(Ok(ClientHello::NeedMore));
        }
        match sni::parse(buf) {
            Ok(ClientHello::NeedMore) => {}
            verdict => return Ok(verdict),
        }
    }
}

/// A stream that counts the bytes read from it: the client's are the bytes sent to the
/// backend, the backend's those sent to the client. Counted as they pass, so a connection that
/// ends in an error still counts, and a long one shows while it lasts.
struct Counted<S> {
    inner: S,
    read: Counter,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            self.read.inc_by((buf.filled().len() - before) as u64);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
