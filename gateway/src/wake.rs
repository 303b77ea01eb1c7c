//! Waking an asleep tenant when a connection arrives for it.
//!
//! Data flow: the proxy reads a connection's ClientHello, finds its route asleep and calls
//! [`Wakes::wake`], which hands back a [`Ticket`]: a share of the one wake request
//! (`POST /v1/gateway/wake`, [`Vcp::wake`]) made for that tenant in the last [`WAKE_EVERY`].
//! The first connection starts the request (as a task of its own, so it finishes even if that
//! connection goes); every connection arriving meanwhile joins it, so a burst of clients, or a
//! client retrying in a loop, costs vcp one call. The proxy meanwhile dials the tenant's
//! backend until it accepts (see [`crate::proxy`]) and reads the ticket's [`Answer`] only to
//! close at once when vcp knows no such tenant.
//!
//! [`Dedupe`] is the bookkeeping alone (a key and a clock in, a shared answer out), tested with
//! plain futures; [`Wakes`] adds vcp, the metrics and the logs.

use crate::metrics::Metrics;
use crate::route::TenantKey;
use crate::vcp::{Vcp, Woken};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// At most one wake request per tenant this often, however many connections arrive.
pub const WAKE_EVERY: Duration = Duration::from_secs(2);

/// What became of a wake request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// vcp took it (202): the tenant is waking, or awake already.
    Requested,
    /// vcp knows no live tenant with the key (404).
    NotFound,
    /// vcp did not take it: unreachable, a wrong token, an error. Connections still wait for
    /// the backend: another replica, or the tenant's owner, may wake it.
    Failed,
    /// No vcp is configured: nobody was asked.
    NotAsked,
}

impl Answer {
    pub fn as_str(self) -> &'static str {
        match self {
            Answer::Requested => "requested",
            Answer::NotFound => "not_found",
            Answer::Failed => "failed",
            Answer::NotAsked => "not_asked",
        }
    }
}

type Pending = Shared<BoxFuture<'static, Answer>>;

/// A connection's share of a wake request.
#[derive(Clone)]
pub struct Ticket {
    answer: Pending,
    /// Set by the first connection of this wake to reach the backend.
    through: Arc<AtomicBool>,
}

impl Ticket {
    /// A ticket already answered (no vcp to ask).
    pub fn ready(answer: Answer) -> Ticket {
        Ticket {
            answer: futures::future::ready(answer).boxed().shared(),
            through: Arc::default(),
        }
    }

    /// vcp's answer, once it came.
    pub async fn answer(&self) -> Answer {
        self.answer.clone().await
    }

    /// True for the first connection of this wake that reaches the backend, and only for it:
    /// it logs the wake, so a wake is one line however many connections waited.
    pub fn first_through(&self) -> bool {
        !self.through.swap(true, Ordering::AcqRel)
    }
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("answer", &self.answer.peek())
            .finish_non_exhaustive()
    }
}

/// One wake request per tenant per [`WAKE_EVERY`], shared by every connection that arrives
/// meanwhile. Holds one entry per tenant ever woken, dropped with its route ([`Dedupe::forget`]),
/// so it is bounded by the route table.
#[derive(Default)]
pub struct Dedupe {
    requests: Mutex<HashMap<TenantKey, (Instant, Ticket)>>,
}

impl Dedupe {
    /// The ticket of the request for `key` started within [`WAKE_EVERY`] before `now`, or a new
    /// one from `start` (which only makes the future: it runs under the lock). The bool says
    /// whether `start` was called.
    pub fn join(
        &self,
        key: &TenantKey,
        now: Instant,
        start: impl FnOnce() -> BoxFuture<'static, Answer>,
    ) -> (Ticket, bool) {
        let mut requests = self.requests.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((at, ticket)) = requests.get(key.as_str())
            && now.saturating_duration_since(*at) < WAKE_EVERY
        {
            return (ticket.clone(), false);
        }
        let ticket = Ticket {
            answer: start().shared(),
            through: Arc::default(),
        };
        requests.insert(key.clone(), (now, ticket.clone()));
        (ticket, true)
    }

    /// Drops the entry of a tenant whose route went.
    pub fn forget(&self, key: &str) {
        let mut requests = self.requests.lock().unwrap_or_else(PoisonError::into_inner);
        requests.remove(key);
    }
}

impl std::fmt::Debug for Dedupe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let requests = self.requests.lock().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Dedupe")
            .field("tenants", &requests.len())
            .finish()
    }
}

/// Wake requests to vcp (none without one), deduplicated, counted and logged.
#[derive(Debug)]
pub struct Wakes {
    vcp: Option<Vcp>,
    dedupe: Dedupe,
    metrics: Arc<Metrics>,
}

impl Wakes {
    pub fn new(vcp: Option<Vcp>, metrics: Arc<Metrics>) -> Wakes {
        Wakes {
            vcp,
            dedupe: Dedupe::default(),
            metrics,
        }
    }

    /// A share of the wake request for `key` (must be called within a tokio runtime).
    pub fn wake(&self, key: &TenantKey) -> Ticket {
        let Some(vcp) = &self.vcp else {
            return Ticket::ready(Answer::NotAsked);
        };
        let start = || {
            let (vcp, key, metrics) = (vcp.clone(), key.clone(), self.metrics.clone());
            let task = tokio::spawn(async move { request(&vcp, &key, &metrics).await });
            async move { task.await.unwrap_or(Answer::Failed) }.boxed()
        };
        self.dedupe.join(key, Instant::now(), start).0
    }

    /// Drops what is kept for a tenant whose route went.
    pub fn forget(&self, key: &str) {
        self.dedupe.forget(key);
    }
}

async fn request(vcp: &Vcp, key: &TenantKey, metrics: &Metrics) -> Answer {
    let answer = match vcp.wake(key).await {
        Ok(Woken::Waking { woken }) => {
            tracing::debug!(tenant = %key, woken, "asked vcp to wake the tenant");
            Answer::Requested
        }
        Ok(Woken::NotFound) => {
            tracing::info!(tenant = %key, "vcp knows no live tenant with this key; closing its connections");
            Answer::NotFound
        }
        Err(error) => {
            let token = matches!(error, crate::Error::VcpToken { .. });
            let error = vcp_core::chain(&error);
            if token {
                tracing::error!(tenant = %key, error, "wake refused: check the gateway's vcp token; waiting for the apiserver anyway");
            } else {
                tracing::warn!(tenant = %key, error, "wake request failed; waiting for the apiserver anyway");
            }
            Answer::Failed
        }
    };
    metrics.wake(answer);
    answer
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn name(s: &str) -> TenantKey {
        TenantKey::new(s).unwrap()
    }

    /// A `start` that counts its calls and answers `answer`.
    fn counting(
        calls: &Arc<AtomicUsize>,
        answer: Answer,
    ) -> impl FnOnce() -> BoxFuture<'static, Answer> {
        let calls = calls.clone();
        move || {
            calls.fetch_add(1, Ordering::SeqCst);
            futures::future::ready(answer).boxed()
        }
    }

    #[tokio::test]
    async fn connections_within_two_seconds_share_one_request() {
        let dedupe = Dedupe::default();
        let calls = Arc::new(AtomicUsize::new(0));
        let t0 = Instant::now();
        let (first, started) = dedupe.join(&name("a"), t0, counting(&calls, Answer::Requested));
        assert!(started);
        for ms in [0, 1, 500, 1999] {
            let at = t0 + Duration::from_millis(ms);
            let (joined, started) = dedupe.join(&name("a"), at, counting(&calls, Answer::Failed));
            assert!(!started, "{ms} ms later");
            assert_eq!(
                joined.answer().await,
                Answer::Requested,
                "the first's answer"
            );
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(first.answer().await, Answer::Requested);
        // Another tenant is another request.
        let (_, started) = dedupe.join(&name("b"), t0, counting(&calls, Answer::Requested));
        assert!(started);
        // Two seconds on, a connection asks again.
        let later = t0 + WAKE_EVERY;
        let (again, started) = dedupe.join(&name("a"), later, counting(&calls, Answer::NotFound));
        assert!(started);
        assert_eq!(again.answer().await, Answer::NotFound);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        // A forgotten tenant starts afresh.
        dedupe.forget("a");
        let (_, started) = dedupe.join(&name("a"), later, counting(&calls, Answer::Requested));
        assert!(started);
    }

    #[tokio::test]
    async fn concurrent_connections_wait_for_the_one_answer() {
        let dedupe = Dedupe::default();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let now = Instant::now();
        let start = move || async move { rx.await.unwrap_or(Answer::Failed) }.boxed();
        let (first, _) = dedupe.join(&name("a"), now, start);
        let waiters: Vec<_> = (0..5)
            .map(|_| {
                let (ticket, started) = dedupe.join(&name("a"), now, || unreachable!());
                assert!(!started);
                tokio::spawn(async move { ticket.answer().await })
            })
            .collect();
        tx.send(Answer::NotFound).unwrap();
        for w in waiters {
            assert_eq!(w.await.unwrap(), Answer::NotFound);
        }
        assert_eq!(first.answer().await, Answer::NotFound);
    }

    #[test]
    fn only_the_first_connection_through_logs_the_wake() {
        let ticket = Ticket::ready(Answer::Requested);
        let other = ticket.clone();
        assert!(ticket.first_through());
        assert!(!other.first_through());
        assert!(!ticket.first_through());
    }
}
