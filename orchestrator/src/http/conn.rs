//! How the API's connections are accepted, bounded and timed out, so that clients that send
//! nothing, half a request or a short body cannot hold the server's sockets.
//!
//! Data flow: [`serve`] takes a permit of the connection cap ([`Limits::max_connections`])
//! before each accept, so past the cap new clients wait in the kernel's backlog instead of
//! costing a file descriptor each. Each connection is served by hyper (HTTP/1.1, keep-alive)
//! through a [`Watch`] that sees every byte read and every request start and end, and a
//! watchdog closes the connection when
//! - it waits for a request (a new connection, or a kept-alive one after its last answer) and
//!   not one byte of it arrives within [`Limits::idle`];
//! - a request head has begun and is not complete within [`Limits::header`].
//!
//! A request's body must arrive whole within [`Limits::body`] of its head (and within
//! [`Limits::max_body`]); otherwise the answer is 408 (413 when too large) and the connection
//! closes. The handlers then see a body already in memory. On shutdown every connection
//! finishes its request in flight and closes.

use crate::http::problem::Problem;
use axum::Router;
use axum::response::IntoResponse;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tower::ServiceExt as _;

/// How long a connection may take for each part of a request, and how many may be open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A connection waiting for a request without receiving a byte of it.
    pub idle: Duration,
    /// From the first byte of a request head to its end.
    pub header: Duration,
    /// From the end of a request head to the end of its body.
    pub body: Duration,
    /// Connections open at once.
    pub max_connections: usize,
    /// The largest request body, in bytes: [`super::MAX_BODY`] for the API; more for the
    /// tenant audit ingest, whose batches are larger.
    pub max_body: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            idle: Duration::from_secs(60),
            header: Duration::from_secs(10),
            body: Duration::from_secs(30),
            max_connections: 1024,
            max_body: super::MAX_BODY,
        }
    }
}

/// What a connection's watchdog reads: whether a request is being handled, and since when the
/// connection has waited for the next one, and since when that one's head has been arriving.
#[derive(Debug)]
struct Activity {
    start: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds since `start` when the connection last started waiting for a request.
    waiting_since: AtomicU64,
    /// Milliseconds since `start` (plus one) of the first byte of the awaited request; 0: none.
    first_byte: AtomicU64,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            start: Instant::now(),
            in_flight: AtomicUsize::new(0),
            waiting_since: AtomicU64::new(0),
            first_byte: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn read(&self, n: usize) {
        if n > 0 && self.in_flight.load(Ordering::Acquire) == 0 {
            let _ = self.first_byte.compare_exchange(
                0,
                self.now_ms() + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }

    fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    fn request_ended(&self) {
        if self.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.waiting_since.store(self.now_ms(), Ordering::Release);
            self.first_byte.store(0, Ordering::Release);
        }
    }

    /// Why the connection must close now, if it must.
    fn expired(&self, limits: &Limits) -> Option<&'static str> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let now = self.now_ms();
        match self.first_byte.load(Ordering::Acquire) {
            0 => {
                let waited = now.saturating_sub(self.waiting_since.load(Ordering::Acquire));
                (u128::from(waited) > limits.idle.as_millis()).then_some("idle")
            }
            first => {
                let reading = now.saturating_sub(first - 1);
                (u128::from(reading) > limits.header.as_millis()).then_some("header")
            }
        }
    }
}

/// A connection's socket, telling [`Activity`] about every byte read.
struct Watch {
    io: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watch {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let res = Pin::new(&mut self.io).poll_read(cx, buf);
        self.activity.read(buf.filled().len() - before);
        res
    }
}

impl AsyncWrite for Watch {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Reads a request's body whole, within the body timeout and size limit.
async fn buffered(
    req: hyper::Request<Incoming>,
    limits: &Limits,
) -> Result<axum::extract::Request, axum::response::Response> {
    let (parts, body) = req.into_parts();
    let collected =
        tokio::time::timeout(limits.body, Limited::new(body, limits.max_body).collect()).await;
    let closing = |p: Problem| {
        let mut res = p.into_response();
        res.headers_mut().insert(
            hyper::header::CONNECTION,
            hyper::header::HeaderValue::from_static("close"),
        );
        res
    };
    match collected {
        Ok(Ok(body)) => Ok(axum::extract::Request::from_parts(
            parts,
            axum::body::Body::new(Full::new(body.to_bytes())),
        )),
        Ok(Err(e))
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(closing(Problem::new(
                axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                "too-large",
                "request body too large",
                &format!("a request body may hold at most {} bytes", limits.max_body),
                None,
            )))
        }
        Ok(Err(_)) => Err(closing(Problem::new(
            axum::http::StatusCode::BAD_REQUEST,
            "malformed",
            "malformed request body",
            "the connection ended or broke before the whole body arrived",
            None,
        ))),
        Err(_) => Err(closing(Problem::new(
            axum::http::StatusCode::REQUEST_TIMEOUT,
            "body-timeout",
            "request body too slow",
            &format!(
                "the whole body must arrive within {} s of the request head",
                limits.body.as_secs()
            ),
            None,
        ))),
    }
}

/// Serves `router` on `listener` within `limits` until `shutdown` resolves; then lets each
/// connection finish its request in flight.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => break,
            p = permits.clone().acquire_owned() => p.map_err(std::io::Error::other)?,
        };
        let (tcp, peer) = tokio::select! {
            () = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors, say: back off instead of spinning.
                    tracing::warn!(error = %e, "api: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let router = router.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let activity = Arc::new(Activity::new());
            let io = Watch {
                io: tcp,
                activity: activity.clone(),
            };
            let svc_activity = activity.clone();
            let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                let (router, activity) = (router.clone(), svc_activity.clone());
                async move {
                    activity.request_started();
                    let res = match buffered(req, &limits).await {
                        Ok(req) => match router.oneshot(req).await {
                            Ok(res) => res,
                            Err(never) => match never {},
                        },
                        Err(res) => res,
                    };
                    activity.request_ended();
                    Ok::<_, std::convert::Infallible>(res)
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .keep_alive(true)
                .serve_connection(TokioIo::new(io), service);
            let mut conn = std::pin::pin!(conn);
            let tick = Duration::from_millis(100);
            loop {
                tokio::select! {
                    r = conn.as_mut() => {
                        if let Err(e) = r {
                            tracing::debug!(%peer, error = %e, "api: connection ended");
                        }
                        return;
                    }
                    _ = stop.changed() => {
                        conn.as_mut().graceful_shutdown();
                    }
                    () = tokio::time::sleep(tick) => {
                        if let Some(why) = activity.expired(&limits) {
                            tracing::debug!(%peer, why, "api: connection timed out");
                            return;
                        }
                    }
                }
            }
        });
    }
    let _ = stop_tx.send(true);
    // Every connection holds a permit until it is done: all back means all closed.
    let all = u32::try_from(limits.max_connections.max(1)).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(Duration::from_secs(30), permits.acquire_many(all)).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn limits(idle_ms: u64, header_ms: u64, body_ms: u64, max: usize) -> Limits {
        Limits {
            idle: Duration::from_millis(idle_ms),
            header: Duration::from_millis(header_ms),
            body: Duration::from_millis(body_ms),
            max_connections: max,
            max_body: crate::http::MAX_BODY,
        }
    }

    #[test]
    fn a_connection_expires_by_idleness_before_a_request_and_by_header_time_during_one() {
        let l = limits(200, 100, 1000, 1);
        let a = Activity::new();
        assert_eq!(a.expired(&l), None);
        std::thread::sleep(Duration::from_millis(120));
        assert_eq!(a.expired(&l), None, "idle, under the idle limit");
        a.read(5);
        std::thread::sleep(Duration::from_millis(120));
        assert_eq!(a.expired(&l), Some("header"), "a head begun 120 ms ago");
        a.request_started();
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(a.expired(&l), None, "a request in flight never expires");
        a.read(5);
        a.request_ended();
        assert_eq!(
            a.expired(&l),
            None,
            "bytes read during the request are not the next head"
        );
        std::thread::sleep(Duration::from_millis(220));
        assert_eq!(a.expired(&l), Some("idle"));
    }

    async fn server(l: Limits) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new()
            .route("/ok", axum::routing::get(|| async { "ok" }))
            .route("/echo", axum::routing::post(|b: Bytes| async move { b }));
        tokio::spawn(serve(listener, router, l, std::future::pending()));
        addr
    }

    /// Reads until the server closes; what it sent and how long that took.
    async fn until_closed(s: &mut TcpStream) -> (String, Duration) {
        let t0 = Instant::now();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
        (String::from_utf8_lossy(&out).into_owned(), t0.elapsed())
    }

    #[tokio::test]
    async fn silent_half_headed_and_short_bodied_clients_are_cut_off() {
        let addr = server(limits(600, 300, 300, 16)).await;
        // Nothing at all: closed after the idle limit, not before.
        let mut s = TcpStream::connect(addr).await.unwrap();
        let (out, took) = until_closed(&mut s).await;
        assert!(out.is_empty(), "{out}");
        assert!(
            took >= Duration::from_millis(500) && took < Duration::from_secs(5),
            "{took:?}"
        );
        // Half a head: closed after the header limit.
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        let (out, took) = until_closed(&mut s).await;
        assert!(!out.contains("200"), "{out}");
        assert!(took < Duration::from_secs(5), "{took:?}");
        // A body shorter than its Content-Length: 408, then closed.
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly ten..")
            .await
            .unwrap();
        let (out, took) = until_closed(&mut s).await;
        assert!(out.starts_with("HTTP/1.1 408"), "{out}");
        assert!(out.contains("body-timeout"), "{out}");
        assert!(took < Duration::from_secs(5), "{took:?}");
        // A whole request is answered, and the kept-alive connection then idles out.
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let (out, _) = until_closed(&mut s).await;
        assert!(
            out.starts_with("HTTP/1.1 200") && out.ends_with("ok"),
            "{out}"
        );
    }

    #[tokio::test]
    async fn past_the_cap_a_client_waits_until_a_connection_closes() {
        let addr = server(limits(800, 800, 800, 2)).await;
        let _a = TcpStream::connect(addr).await.unwrap();
        let _b = TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let t0 = Instant::now();
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let (out, _) = until_closed(&mut c).await;
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        // Served only once the two idle connections were cut off.
        assert!(
            t0.elapsed() >= Duration::from_millis(600),
            "{:?}",
            t0.elapsed()
        );
    }

    #[tokio::test]
    async fn an_oversized_body_is_refused_with_413() {
        let addr = server(limits(2000, 2000, 2000, 4)).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        let big = super::super::MAX_BODY + 1;
        s.write_all(
            format!("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {big}\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let chunk = vec![b'a'; 8192];
        let mut sent = 0;
        while sent < big {
            let n = chunk.len().min(big - sent);
            if s.write_all(&chunk[..n]).await.is_err() {
                break;
            }
            sent += n;
        }
        let (out, _) = until_closed(&mut s).await;
        assert!(out.starts_with("HTTP/1.1 413"), "{out}");
    }
}
