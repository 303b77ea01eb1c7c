//! Prometheus metrics of the syncer, served as text on `/metrics` (see docs/syncer.md).
//!
//! - `vcp_syncer_sync_duration_seconds{kind, direction}`: how long one sync of one object
//!   took, `down` (a tenant object reconciled onto the host, or a host object collected) or
//!   `up` (host state written back to the tenant: pod status and binding, events).
//! - `vcp_syncer_reconciles_in_flight{kind}`: reconciles running now; at the worker limit it
//!   means the queue is backing up.
//! - `vcp_syncer_sync_errors_total{kind, error}`: failed syncs by error variant.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::future::Future;
use std::time::Instant;

/// Which way a sync went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Down,
    Up,
}

impl Direction {
    fn as_str(self) -> &'static str {
        match self {
            Direction::Down => "down",
            Direction::Up => "up",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SyncLabels {
    kind: String,
    direction: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    kind: String,
    error: String,
}

type Histograms = Family<SyncLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1 ms to ~33 s: a cached no-op to a slow apiserver under load.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// The syncer's metrics and their registry.
pub struct Metrics {
    registry: Registry,
    duration: Histograms,
    in_flight: Family<KindLabels, Gauge>,
    errors: Family<ErrorLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// Decrements the in-flight gauge even when a reconcile is cancelled mid-way.
struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let duration = Histograms::new_with_constructor(latency_histogram);
        let in_flight = Family::<KindLabels, Gauge>::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "vcp_syncer_sync_duration_seconds",
            "Duration of one object's sync, by kind and direction (down: onto the host, up: back to the tenant)",
            duration.clone(),
        );
        registry.register(
            "vcp_syncer_reconciles_in_flight",
            "Reconciles running now, by kind",
            in_flight.clone(),
        );
        registry.register(
            "vcp_syncer_sync_errors",
            "Failed syncs, by kind and error variant",
            errors.clone(),
        );
        Metrics {
            registry,
            duration,
            in_flight,
            errors,
        }
    }

    /// Runs one sync of a `kind` object, timing it; `reconcile` also counts it as in flight.
    pub async fn timed<T>(
        &self,
        kind: &str,
        direction: Direction,
        reconcile: bool,
        sync: impl Future<Output = T>,
    ) -> T {
        let _in_flight = reconcile.then(|| {
            let g = self
                .in_flight
                .get_or_create(&KindLabels { kind: kind.into() })
                .clone();
            g.inc();
            InFlight(g)
        });
        let start = Instant::now();
        let out = sync.await;
        self.duration
            .get_or_create(&SyncLabels {
                kind: kind.into(),
                direction: direction.as_str().into(),
            })
            .observe(start.elapsed().as_secs_f64());
        out
    }

    /// Counts a failed sync.
    pub fn error(&self, kind: &str, err: &crate::Error) {
        self.errors
            .get_or_create(&ErrorLabels {
                kind: kind.into(),
                error: err.variant().into(),
            })
            .inc();
    }

    /// The metrics in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syncs_errors_and_in_flight_reconciles_are_exported() {
        let m = Metrics::new();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(m.timed("Pod", Direction::Down, true, async {}));
        rt.block_on(m.timed("Pod", Direction::Up, false, async {}));
        m.error("Pod", &crate::Error::NotReady("x".into()));
        let text = m.encode();
        for line in [
            r#"vcp_syncer_sync_duration_seconds_count{kind="Pod",direction="down"} 1"#,
            r#"vcp_syncer_sync_duration_seconds_count{kind="Pod",direction="up"} 1"#,
            r#"vcp_syncer_reconciles_in_flight{kind="Pod"} 0"#,
            r#"vcp_syncer_sync_errors_total{kind="Pod",error="not_ready"} 1"#,
        ] {
            assert!(text.contains(line), "{line} missing in:\n{text}");
        }
    }
}
