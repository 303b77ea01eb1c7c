//! The TLS port: accept, read the ClientHello, route by its server name, splice.
//!
//! Data flow, per connection ([`Gateway::serve`] accepts, one task each):
//! 1. A permit from the connection limit, or the connection is closed at once (`over_limit`).
//! 2. Reads until [`sni::parse`] gives a verdict, all of it within the handshake timeout: a
//!    client dribbling bytes is cut off when the time is up, however much it still sends.
//! 3. The name goes through [`route::tenant_of`] and the [`RouteTable`]. A refusal (no name, a
//!    stream that is not TLS, a name that is no tenant's) closes the connection at once with no
//!    TLS alert (the gateway speaks no TLS), is logged at info with its reason and is counted.
//! 4. Otherwise: a connection to the tenant's Service within the connect timeout, the bytes
//!    already read written first, then both directions copied until either side ends. TLS runs
//!    end to end between the client and the tenant apiserver; the gateway holds no key.
//!
//! Each tenant's [`Activity`] (last accepted or ended connection, connections open) is kept
//! for sleep mode, which reads it. On shutdown the listener closes and open connections get a
//! bounded time to finish.

use crate::metrics::{Direction, Metrics, Outcome};
use crate::route::{self, Domain, RouteTable, TenantKey};
use crate::sni::{self, ClientHello};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
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
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            handshake_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(3),
            max_connections: 10_000,
            drain_timeout: Duration::from_secs(20),
        }
    }
}

/// When a tenant's apiserver was last wanted, and whether it is in use now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantActivity {
    /// When a connection for the tenant was last accepted or ended.
    pub last: Instant,
    /// Its connections open now (a `kubectl get -w` is one, for as long as it watches).
    pub open: u32,
}

/// Per-tenant activity, shared by the proxy (which writes it on every routed connection's
/// start and end: one map update) and sleep mode (which reads it). Only tenants with a route
/// have an entry, and the entry goes with the route ([`Activity::forget`]).
#[derive(Debug, Clone, Default)]
pub struct Activity(Arc<Mutex<HashMap<TenantKey, TenantActivity>>>);

impl Activity {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<TenantKey, TenantActivity>> {
        // Every update is one statement; a poisoned map is still consistent.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A tenant's activity, if a connection for it was seen since its route appeared.
    pub fn get(&self, tenant: &str) -> Option<TenantActivity> {
        self.map().get(tenant).copied()
    }

    /// Every tenant's activity.
    pub fn snapshot(&self) -> Vec<(TenantKey, TenantActivity)> {
        self.map().iter().map(|(n, a)| (n.clone(), *a)).collect()
    }

    /// Drops a tenant whose route went.
    pub fn forget(&self, tenant: &str) {
        self.map().remove(tenant);
    }

    fn opened(&self, tenant: &TenantKey) {
        let now = Instant::now();
        let mut map = self.map();
        match map.get_mut(tenant.as_str()) {
            Some(a) => {
                a.last = now;
                a.open += 1;
            }
            None => {
                map.insert(tenant.clone(), TenantActivity { last: now, open: 1 });
            }
        }
    }

    fn closed(&self, tenant: &str) {
        // Only an existing entry: a connection that outlives its route does not bring the
        // forgotten tenant back.
        if let Some(a) = self.map().get_mut(tenant) {
            a.last = Instant::now();
            a.open = a.open.saturating_sub(1);
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
    pub fn new(domain: Domain, routes: Arc<RouteTable>, limits: Limits) -> Gateway {
        Gateway {
            domain,
            permits: Arc::new(Semaphore::new(limits.max_connections as usize)),
            limits,
            routes,
            activity: Activity::default(),
            metrics: Arc::new(Metrics::new()),
        }
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
            tokio::spawn(self.clone().connection(stream, peer, permit));
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
        _permit: OwnedSemaphorePermit,
    ) {
        let active = self.metrics.active();
        active.inc();
        let _active = Active(active);
        // Small writes (a kubectl request, a watch event) go out at once.
        let _ = client.set_nodelay(true);
        let mut hello = Vec::new();
        let (tenant, backend) = match self.admit(&mut client, &mut hello).await {
            Ok(routed) => routed,
            Err(refusal) => return self.refuse(peer, refusal),
        };
        self.activity.opened(&tenant);
        let _open = Open {
            activity: self.activity.clone(),
            tenant: tenant.clone(),
        };
        self.splice(client, peer, &tenant, backend, &hello).await;
    }

    /// Reads the ClientHello into `hello` and finds the route of the tenant it names.
    async fn admit(
        &self,
        client: &mut TcpStream,
        hello: &mut Vec<u8>,
    ) -> Result<(TenantKey, SocketAddr), Refusal> {
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
        Ok((tenant, route.backend))
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

    /// Connects to `backend`, sends it the ClientHello already read, then copies both ways
    /// until either side ends.
    async fn splice(
        &self,
        client: TcpStream,
        peer: SocketAddr,
        tenant: &TenantKey,
        backend: SocketAddr,
        hello: &[u8],
    ) {
        let connect =
            tokio::time::timeout(self.limits.connect_timeout, TcpStream::connect(backend));
        let upstream = match connect.await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return self.unreachable(peer, tenant, backend, &e.to_string()),
            Err(_) => return self.unreachable(peer, tenant, backend, "connect timeout"),
        };
        let _ = upstream.set_nodelay(true);
        self.metrics.outcome(Outcome::Routed);
        self.metrics.routed(tenant);
        tracing::debug!(%peer, %tenant, %backend, "routed");
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

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> TenantKey {
        TenantKey::new(s).unwrap()
    }

    #[test]
    fn activity_counts_open_connections_and_keeps_the_last_time() {
        let activity = Activity::default();
        assert_eq!(activity.get("a"), None);
        activity.opened(&name("a"));
        activity.opened(&name("a"));
        let first = activity.get("a").unwrap();
        assert_eq!(first.open, 2);
        activity.closed("a");
        let later = activity.get("a").unwrap();
        assert_eq!(later.open, 1);
        assert!(later.last >= first.last);
        activity.forget("a");
        activity.closed("a");
        assert_eq!(
            activity.get("a"),
            None,
            "a forgotten tenant is not brought back"
        );
        assert!(activity.snapshot().is_empty());
    }
}
