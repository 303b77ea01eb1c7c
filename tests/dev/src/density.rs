//! `vcp-dev bench density`: how many idle tenants a node holds, and what one costs.
//!
//! Against a running dev cluster with the real node (`up --real-node`, its state dir), it
//! creates tenants `dens-0`, `dens-1`, ... one after the other through the platform API, each
//! waited for until Ready, and stops at the first that does not become Ready, at `--tenants`,
//! or when the node's available memory falls below `--reserve-mib` (the machine must stay
//! usable). Then it lets them idle and reads the real kubelet's own figures twice, `--idle-seconds`
//! apart, from its summary API (`/api/v1/nodes/<node>/proxy/stats/summary`): each pod's
//! memory working set (what the kubelet evicts on and what a cgroup limit counts: usage less
//! the inactive file pages) and its CPU time. The pods of a tenant are those of its
//! control-plane namespace (`vcp-<key>`); the members of shared datastores (`vcp-datastore-*`)
//! count for all of them, each tenant its share (their sum over the tenants measured).
//!
//! Data flow: the summary JSON -> [`PodSample`]s ([`samples`]) -> [`Figures`] ([`figures`],
//! pure) -> one summary line ([`Figures::line`]). The tenants it made are deleted at the end
//! unless `--keep`.

use anyhow::Context;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// `bench density` settings.
#[derive(Debug, Clone, clap::Args)]
pub struct DensityBench {
    #[arg(long, env = "VCP_DEV_STATE_DIR")]
    pub state_dir: PathBuf,
    /// The most tenants to create.
    #[arg(long, env = "VCP_BENCH_TENANTS", default_value_t = 40)]
    pub tenants: usize,
    /// Their plan (default: the platform's default plan).
    #[arg(long, env = "VCP_BENCH_PLAN")]
    pub plan: Option<String>,
    /// Seconds of idling measured once the last tenant is Ready.
    #[arg(long, env = "VCP_BENCH_IDLE_SECONDS", default_value_t = 60)]
    pub idle_seconds: u64,
    /// Stop creating when the node has less memory available than this (MiB).
    #[arg(long, env = "VCP_BENCH_RESERVE_MIB", default_value_t = 3072)]
    pub reserve_mib: u64,
    /// Keep the tenants afterwards.
    #[arg(long, env = "VCP_BENCH_KEEP")]
    pub keep: bool,
}

/// One pod as the kubelet's summary shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct PodSample {
    pub namespace: String,
    pub name: String,
    pub working_set_bytes: u64,
    pub cpu_core_ns: u64,
}

/// The pods of a kubelet summary (`/stats/summary`). A pod without memory or CPU figures yet
/// (just started) counts as zero.
pub fn samples(summary: &Value) -> Vec<PodSample> {
    summary["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| PodSample {
            namespace: p["podRef"]["namespace"].as_str().unwrap_or_default().into(),
            name: p["podRef"]["name"].as_str().unwrap_or_default().into(),
            working_set_bytes: p["memory"]["workingSetBytes"].as_u64().unwrap_or(0),
            cpu_core_ns: p["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap_or(0),
        })
        .collect()
}

/// The component a control-plane pod runs, from its name (a Deployment's pods carry two
/// generated suffixes, a StatefulSet's an ordinal).
pub fn component(pod: &str) -> &str {
    const KNOWN: [&str; 5] = [
        "kube-apiserver",
        "kube-controller-manager",
        "etcd",
        "coredns",
        "vcp-syncer",
    ];
    KNOWN
        .into_iter()
        .find(|k| pod == *k || pod.strip_prefix(k).is_some_and(|r| r.starts_with('-')))
        .unwrap_or("other")
}

/// What the run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    pub tenants: usize,
    /// Mean working set of a tenant (all its pods, and its share of a shared datastore's), MiB.
    pub tenant_mib: f64,
    /// The shared datastores' members together, MiB (0 without one).
    pub shared_mib: f64,
    /// The largest tenant's, MiB.
    pub tenant_max_mib: f64,
    /// Mean working set per component across tenants, MiB.
    pub component_mib: BTreeMap<String, f64>,
    /// Mean CPU of an idle tenant over the idle window, millicores.
    pub idle_mcpu_per_tenant: f64,
    /// Tenants per GiB of working set.
    pub tenants_per_gib: f64,
}

/// Where shared datastores run (`vcp-datastore-<name>`): their members count for the
/// measured tenants together.
pub const SHARED_NAMESPACE_PREFIX: &str = "vcp-datastore-";

/// [`Figures`] of the tenants whose control-plane namespaces are `namespaces`, from two
/// summaries `idle_s` seconds apart (`before`, `after`). Memory is `after`'s; CPU is the
/// difference.
pub fn figures(
    namespaces: &[String],
    before: &[PodSample],
    after: &[PodSample],
    idle_s: f64,
) -> Option<Figures> {
    if namespaces.is_empty() {
        return None;
    }
    let mut per_tenant = Vec::new();
    let mut per_component: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut cpu_ns = 0u64;
    for ns in namespaces {
        let pods: Vec<&PodSample> = after.iter().filter(|p| &p.namespace == ns).collect();
        let mut bytes = 0u64;
        for p in &pods {
            bytes += p.working_set_bytes;
            per_component
                .entry(component(&p.name).to_owned())
                .or_default()
                .push(mib(p.working_set_bytes));
            let was = before
                .iter()
                .find(|b| b.namespace == p.namespace && b.name == p.name)
                .map_or(0, |b| b.cpu_core_ns);
            cpu_ns += p.cpu_core_ns.saturating_sub(was);
        }
        per_tenant.push(mib(bytes));
    }
    // A shared datastore's members serve every tenant on it: their share is theirs / N.
    let mut shared_bytes = 0u64;
    for p in after
        .iter()
        .filter(|p| p.namespace.starts_with(SHARED_NAMESPACE_PREFIX))
    {
        shared_bytes += p.working_set_bytes;
        let was = before
            .iter()
            .find(|b| b.namespace == p.namespace && b.name == p.name)
            .map_or(0, |b| b.cpu_core_ns);
        cpu_ns += p.cpu_core_ns.saturating_sub(was);
    }
    let n = per_tenant.len() as f64;
    let shared_mib = mib(shared_bytes);
    let tenant_mib = per_tenant.iter().sum::<f64>() / n + shared_mib / n;
    let component_mib = per_component
        .into_iter()
        .map(|(k, v)| {
            let mean = v.iter().sum::<f64>() / v.len() as f64;
            (k, mean)
        })
        .collect();
    Some(Figures {
        tenants: per_tenant.len(),
        tenant_mib,
        shared_mib,
        tenant_max_mib: per_tenant.iter().copied().fold(0.0, f64::max) + shared_mib / n,
        component_mib,
        idle_mcpu_per_tenant: cpu_ns as f64 / 1e6 / idle_s.max(1.0) / n,
        tenants_per_gib: if tenant_mib > 0.0 {
            1024.0 / tenant_mib
        } else {
            0.0
        },
    })
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

impl Figures {
    /// The summary line, with why the run stopped and how long the last create took.
    pub fn line(&self, stopped: &str, last_create_s: f64) -> String {
        let components: Vec<String> = self
            .component_mib
            .iter()
            .map(|(k, v)| format!("{}_mib={v:.1}", k.replace('-', "_")))
            .collect();
        format!(
            "bench-density tenants={} stopped={stopped} tenant_mib={:.1} tenant_max_mib={:.1} tenants_per_gib={:.2} idle_mcpu_per_tenant={:.1} last_create_s={last_create_s:.1} shared_datastore_mib={:.1} {}",
            self.tenants,
            self.tenant_mib,
            self.tenant_max_mib,
            self.tenants_per_gib,
            self.idle_mcpu_per_tenant,
            self.shared_mib,
            components.join(" ")
        )
    }
}

/// The admin token `up` wrote into `<state>/env`.
pub(crate) fn admin_token(state_dir: &std::path::Path) -> anyhow::Result<String> {
    let env = std::fs::read_to_string(state_dir.join("env")).with_context(|| {
        format!(
            "reading {}/env (run `vcp-dev up` first)",
            state_dir.display()
        )
    })?;
    env.lines()
        .find_map(|l| l.strip_prefix("export VCP_TOKEN="))
        .map(|v| v.trim_matches('\'').to_owned())
        .context("no VCP_TOKEN in the state dir's env: is the platform up (`vcp-dev up`)?")
}

/// The real node's kubelet summary.
async fn summary(host: &kube::Client) -> anyhow::Result<Value> {
    let path = format!(
        "/api/v1/nodes/{}/proxy/stats/summary",
        vcp_dev::node::NODE_NAME
    );
    let req = http::Request::get(path).body(Vec::new())?;
    let text = host.request_text(req).await.context(
        "reading the real node's kubelet summary (is the dev cluster up with --real-node?)",
    )?;
    Ok(serde_json::from_str(&text)?)
}

/// Runs the benchmark (see the module docs).
pub async fn run(b: DensityBench) -> anyhow::Result<()> {
    let record = vcp_dev::platform::read_record(&b.state_dir)?
        .context("no platform in this state dir: run `vcp-dev up --real-node` first")?;
    let api = vcp_dev::platform::ApiClient::new(&record.api_url, &admin_token(&b.state_dir)?);
    let host = vcp_dev::cluster::client_from(&b.state_dir.join("host.kubeconfig")).await?;
    let mut made: Vec<(String, String)> = Vec::new();
    let mut last_create_s = 0.0;
    let mut stopped = format!("limit:{}", b.tenants);
    for i in 0..b.tenants {
        let available = summary(&host).await?["node"]["memory"]["availableBytes"]
            .as_u64()
            .unwrap_or(0);
        if available < b.reserve_mib * 1024 * 1024 {
            stopped = format!("memory:{}MiB_available", available / (1024 * 1024));
            break;
        }
        let name = format!("dens-{i}");
        let clock = Instant::now();
        let created = match &b.plan {
            Some(plan) => api.create_tenant_with_plan(&name, plan).await,
            None => api.create_tenant(&name).await,
        };
        if let Err(err) = created {
            stopped = format!("create_failed:{name}");
            eprintln!("density: creating {name} failed: {err:#}");
            break;
        }
        match api.wait_ready(&name, Duration::from_secs(300)).await {
            Ok(t) => {
                last_create_s = clock.elapsed().as_secs_f64();
                let key = t["key"].as_str().unwrap_or_default().to_owned();
                eprintln!(
                    "density: {name} Ready in {last_create_s:.1}s ({} MiB available before)",
                    available / (1024 * 1024)
                );
                made.push((name, format!("vcp-{key}")));
            }
            Err(err) => {
                stopped = format!("not_ready:{name}");
                eprintln!("density: {name} did not become Ready: {err:#}");
                // Counted as made, so that it is deleted; its namespace is not measured.
                made.push((name, String::new()));
                break;
            }
        }
    }
    let namespaces: Vec<String> = made
        .iter()
        .filter(|(_, ns)| !ns.is_empty())
        .map(|(_, ns)| ns.clone())
        .collect();
    eprintln!(
        "density: {} tenants Ready; idling {} s",
        namespaces.len(),
        b.idle_seconds
    );
    // Settle: the last tenant's first minutes (its caches filling) are not idle.
    tokio::time::sleep(Duration::from_secs(b.idle_seconds.min(30))).await;
    let before = samples(&summary(&host).await?);
    let clock = Instant::now();
    tokio::time::sleep(Duration::from_secs(b.idle_seconds)).await;
    let after = samples(&summary(&host).await?);
    let result = figures(&namespaces, &before, &after, clock.elapsed().as_secs_f64());
    if !b.keep {
        for (name, _) in &made {
            if let Err(err) = api.delete_tenant(name).await {
                eprintln!("density: deleting {name}: {err:#}");
            }
        }
    }
    let figures = result.context("no tenant became Ready: nothing to measure")?;
    println!("{}", figures.line(&stopped, last_create_s));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, mib: u64, cpu_ms: u64) -> Value {
        serde_json::json!({
            "podRef": {"namespace": ns, "name": name},
            "memory": {"workingSetBytes": mib * 1024 * 1024},
            "cpu": {"usageCoreNanoSeconds": cpu_ms * 1_000_000},
        })
    }

    #[test]
    fn components_are_told_by_the_pod_name_prefix() {
        assert_eq!(
            component("kube-apiserver-5fbdbc674f-pgzcr"),
            "kube-apiserver"
        );
        assert_eq!(
            component("kube-controller-manager-7595484f57-zb2d8"),
            "kube-controller-manager"
        );
        assert_eq!(component("etcd-0"), "etcd");
        assert_eq!(component("coredns-86bccdd575-6scwr"), "coredns");
        assert_eq!(component("vcp-syncer-575f77954f-twwvf"), "vcp-syncer");
        assert_eq!(component("etcdfoo-1"), "other");
        assert_eq!(component("snapshot-1"), "other");
    }

    #[test]
    fn figures_count_only_the_measured_tenants_and_cpu_over_the_window() {
        let before = samples(&serde_json::json!({"pods": [
            pod("vcp-a", "etcd-0", 50, 1000),
            pod("vcp-a", "kube-apiserver-x-y", 200, 5000),
            pod("vcp-b", "etcd-0", 60, 2000),
            pod("other", "etcd-0", 999, 0),
        ]}));
        let after = samples(&serde_json::json!({"pods": [
            pod("vcp-a", "etcd-0", 52, 1600),
            pod("vcp-a", "kube-apiserver-x-y", 204, 6000),
            pod("vcp-b", "etcd-0", 60, 2400),
            // Started inside the window: all its CPU counts.
            pod("vcp-b", "kube-apiserver-z-w", 196, 1000),
            pod("other", "etcd-0", 999, 50_000),
            // No figures yet.
            serde_json::json!({"podRef": {"namespace": "vcp-b", "name": "coredns-1-2"}}),
        ]}));
        let ns = vec!["vcp-a".to_owned(), "vcp-b".to_owned()];
        let f = figures(&ns, &before, &after, 60.0).unwrap();
        assert_eq!(f.tenants, 2);
        assert_eq!(f.tenant_mib, 256.0, "(256 + 256) / 2");
        assert_eq!(f.tenant_max_mib, 256.0);
        assert_eq!(f.component_mib["etcd"], 56.0);
        assert_eq!(f.component_mib["kube-apiserver"], 200.0);
        assert_eq!(f.component_mib["coredns"], 0.0);
        // 600 + 1000 + 400 + 1000 ms over 60 s, two tenants: 25 mcpu each.
        assert!((f.idle_mcpu_per_tenant - 25.0).abs() < 1e-9, "{f:?}");
        assert_eq!(f.tenants_per_gib, 4.0);
        let line = f.line("limit:2", 18.5);
        assert!(line.starts_with("bench-density tenants=2 stopped=limit:2 tenant_mib=256.0"));
        assert!(line.contains("kube_apiserver_mib=200.0"), "{line}");
        assert!(line.contains("last_create_s=18.5"), "{line}");
        assert_eq!(figures(&[], &before, &after, 60.0), None);
        assert!(line.contains("shared_datastore_mib=0.0"), "{line}");
    }

    #[test]
    fn a_shared_datastore_counts_for_the_tenants_on_it_in_shares() {
        let before = samples(&serde_json::json!({"pods": [
            pod("vcp-datastore-s", "etcd-0", 60, 1000),
        ]}));
        let after = samples(&serde_json::json!({"pods": [
            pod("vcp-a", "kube-apiserver-x-y", 100, 0),
            pod("vcp-b", "kube-apiserver-z-w", 100, 0),
            pod("vcp-datastore-s", "etcd-0", 60, 4000),
            pod("vcp-datastore-s", "etcd-1", 60, 0),
        ]}));
        let ns = vec!["vcp-a".to_owned(), "vcp-b".to_owned()];
        let f = figures(&ns, &before, &after, 60.0).unwrap();
        assert_eq!(f.shared_mib, 120.0);
        assert_eq!(f.tenant_mib, 160.0, "100 each and half of the members' 120");
        assert_eq!(f.tenant_max_mib, 160.0);
        // The members' 3000 ms over 60 s, shared by two: 25 mcpu each.
        assert!((f.idle_mcpu_per_tenant - 25.0).abs() < 1e-9, "{f:?}");
        assert!(
            f.line("limit:2", 1.0)
                .contains("shared_datastore_mib=120.0")
        );
    }
}
