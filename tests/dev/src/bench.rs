//! `vcp-dev bench sync`: pods straight on the host versus pods through a tenant and its syncer.
//!
//! Throughput: N pods created as fast as `concurrency` allows, directly in a host namespace
//! (until all Running) and then in a tenant (until all tenant pods Running, i.e. synced down,
//! run by kwok, synced up). Latency: L more tenant pods at a fixed rate, watched on both sides:
//! down = tenant create returned -> host pod seen; up = host pod seen Running -> tenant pod
//! seen Running. Resource use of the syncer process from /proc.
//!
//! Two more lines explain the figures without changing them: `bench-sync-requests`, the
//! syncer's own count of apiserver requests (its `/metrics`) per tenant pod, and
//! `bench-sync-cpu`, CPU seconds of every process of the benchmark's clusters per phase (from
//! /proc), which shows what the two shared cores spent on what; its `work_ratio` is the direct
//! phase's CPU over the synced phase's, the throughput ratio a machine doing nothing else
//! could reach if CPU bound.

use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vcp_dev::tenant::TenantControlPlane;
use vcp_dev::{DevCluster, Supervision};

pub struct SyncBench {
    pub pods: usize,
    /// Ratios past which the run fails (CI's regression guard); `None`: not checked.
    pub limits: SyncLimits,
    pub rate: u32,
    pub latency_pods: usize,
    pub concurrency: usize,
    pub tokens: bool,
    /// The syncer binary; the workspace's debug build when `None`.
    pub syncer: Option<std::path::PathBuf>,
}

/// Machine-independent figures of a `bench sync` run, and the limits CI holds them to (each
/// about four times the goal, so noise cannot trip it while a regression like the tenfold one
/// of 2026-11 would).
#[derive(Debug, Clone, Copy, Default)]
pub struct SyncLimits {
    /// Syncer CPU over the host apiserver's in the synced phase.
    pub syncer_share: Option<f64>,
    /// Syncer memory growth per pod, KiB.
    pub kib_per_pod: Option<f64>,
    /// Syncer requests to the tenant apiserver that write, per pod.
    pub tenant_writes_per_pod: Option<f64>,
    /// Syncer requests to the host apiserver that write, per pod.
    pub host_writes_per_pod: Option<f64>,
}

impl SyncLimits {
    /// What exceeds its limit, as `name=value>limit`.
    pub fn exceeded(&self, measured: &SyncLimits) -> Vec<String> {
        let pairs = [
            ("syncer_share", self.syncer_share, measured.syncer_share),
            ("rss_kib_per_pod", self.kib_per_pod, measured.kib_per_pod),
            (
                "tenant_writes_per_pod",
                self.tenant_writes_per_pod,
                measured.tenant_writes_per_pod,
            ),
            (
                "host_writes_per_pod",
                self.host_writes_per_pod,
                measured.host_writes_per_pod,
            ),
        ];
        over_limits(&pairs)
    }
}

/// Figures of a `bench upgrade` run that CI holds to a limit: failed tenants (none), and vcp's
/// CPU over the host apiserver's while the fleet moved (about 0.2 in a simulated run; the limit
/// CI gives is 1.0).
#[derive(Debug, Clone, Copy, Default)]
pub struct UpgradeLimits {
    pub failed: Option<f64>,
    pub vcp_share: Option<f64>,
}

impl UpgradeLimits {
    /// What exceeds its limit, as `name=value>limit`.
    pub fn exceeded(&self, measured: &UpgradeLimits) -> Vec<String> {
        over_limits(&[
            ("failed", self.failed, measured.failed),
            ("vcp_share", self.vcp_share, measured.vcp_share),
        ])
    }
}

/// Each `(name, limit, measured)` past its limit, as `name=value>limit`.
fn over_limits(pairs: &[(&str, Option<f64>, Option<f64>)]) -> Vec<String> {
    pairs
        .iter()
        .filter_map(|(name, limit, value)| match (limit, value) {
            (Some(l), Some(v)) if v.is_nan() || v > l => Some(format!("{name}={v:.2}>{l}")),
            // A limit on a figure the run could not measure fails too.
            (Some(l), None) => Some(format!("{name}=unmeasured>{l}")),
            _ => None,
        })
        .collect()
}

fn pod(name: &str, app: &str, tokens: bool) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {
            "automountServiceAccountToken": tokens,
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        },
    }))
    .expect("valid pod")
}

async fn namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    // Pods are refused until the namespace's default service account exists.
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), name);
    let start = Instant::now();
    while sas.get_opt("default").await?.is_none() {
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(60),
            "no default service account in {name}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

fn running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Creates `n` pods with bounded concurrency and waits until all are Running; seconds taken.
async fn burst(
    client: &Client,
    ns: &str,
    n: usize,
    concurrency: usize,
    tokens: bool,
) -> anyhow::Result<f64> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let start = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                api.create(
                    &PostParams::default(),
                    &pod(&format!("p-{i}"), "burst", tokens),
                )
                .await
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<_>>()
        .await
        .context("creating pods")?;
    loop {
        let list = api.list(&ListParams::default().labels("app=burst")).await?;
        if list.items.iter().filter(|p| running(p)).count() >= n {
            return Ok(start.elapsed().as_secs_f64());
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(1800),
            "pods in {ns} not Running after 30 min"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[derive(Default)]
struct Seen {
    created: HashMap<String, Instant>,
    host_seen: HashMap<String, Instant>,
    host_running: HashMap<String, Instant>,
    tenant_running: HashMap<String, Instant>,
}

fn watch_into(
    client: Client,
    ns: String,
    seen: Arc<Mutex<Seen>>,
    host: bool,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<Pod> = Api::namespaced(client, &ns);
        let mut events = watcher(api, watcher::Config::default().labels("app=lat"))
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(Ok(p)) = events.next().await {
            let now = Instant::now();
            let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
            let name = p.name_any();
            if host {
                s.host_seen.entry(name.clone()).or_insert(now);
                if running(&p) {
                    s.host_running.entry(name).or_insert(now);
                }
            } else if running(&p) {
                s.tenant_running.entry(name).or_insert(now);
            }
        }
    })
}

fn percentile(mut v: Vec<f64>, q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * q).round() as usize]
}

fn proc_usage(pid: u32) -> (f64, f64) {
    let rss_kib = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .unwrap_or(f64::NAN);
    let cpu_ticks = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = s[s.rfind(')')? + 2..].to_owned();
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some(f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?)
        })
        .unwrap_or(f64::NAN);
    // Linux reports CPU time in clock ticks of 1/100 s.
    (rss_kib / 1024.0, cpu_ticks / 100.0)
}

/// Busy CPU seconds of the whole machine so far (every core; /proc/stat less idle and iowait).
fn machine_busy_cpu() -> f64 {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            let f: Vec<f64> = s
                .lines()
                .next()?
                .split_whitespace()
                .skip(1)
                .filter_map(|v| v.parse().ok())
                .collect();
            let idle = f.get(3)? + f.get(4)?;
            Some((f.iter().take(8).sum::<f64>() - idle) / 100.0)
        })
        .unwrap_or(f64::NAN)
}

/// CPU seconds so far of this process and every descendant, by pid, with its name.
fn descendants_cpu() -> HashMap<u32, (String, f64)> {
    let mut procs: HashMap<u32, (u32, String, f64)> = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = stat[open + 1..close].to_owned();
        let f: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
        let (Some(ppid), Some(utime), Some(stime)) = (num(1), num(11), num(12)) else {
            continue;
        };
        procs.insert(pid, (ppid as u32, comm, (utime + stime) / 100.0));
    }
    let me = std::process::id();
    let is_descendant = |mut pid: u32| {
        for _ in 0..32 {
            match procs.get(&pid) {
                Some((ppid, ..)) if *ppid == me => return true,
                Some((ppid, ..)) => pid = *ppid,
                None => return false,
            }
        }
        false
    };
    procs
        .iter()
        .filter(|(pid, _)| **pid == me || is_descendant(**pid))
        .map(|(pid, (_, comm, cpu))| (*pid, (comm.clone(), *cpu)))
        .collect()
}

/// CPU seconds per process name between two snapshots; processes started after `host` are
/// the tenant's (its apiserver has the host's name) and get a `tenant-` prefix.
fn cpu_between(
    host: &HashMap<u32, (String, f64)>,
    from: &HashMap<u32, (String, f64)>,
    to: &HashMap<u32, (String, f64)>,
) -> std::collections::BTreeMap<String, f64> {
    let mut out = std::collections::BTreeMap::new();
    for (pid, (comm, cpu)) in to {
        let before = from.get(pid).map_or(0.0, |(_, c)| *c);
        let name = if host.contains_key(pid) || comm.starts_with("vcp-syncer") {
            comm.clone()
        } else {
            format!("tenant-{comm}")
        };
        *out.entry(name).or_insert(0.0) += cpu - before;
    }
    out
}

fn cpu_line(phase: &str, cpu: &std::collections::BTreeMap<String, f64>) -> String {
    let total: f64 = cpu.values().sum();
    let parts: Vec<String> = cpu
        .iter()
        .filter(|(_, s)| **s >= 0.05)
        .map(|(n, s)| format!("{n}={s:.1}"))
        .collect();
    format!("{phase}_total={total:.1} {}", parts.join(" "))
}

/// The syncer's `/metrics` text (plain HTTP/1.0 on loopback; no client needed).
async fn scrape(addr: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    conn.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut text = String::new();
    conn.read_to_string(&mut text).await?;
    Ok(text)
}

/// Requests per pod from the syncer's `vcp_syncer_api_requests_total` counters: per side,
/// writes and reads (watches excluded: they are long-lived), and every series in detail.
fn requests_line(metrics: &str, pods: usize) -> (String, f64, f64) {
    let mut sums: std::collections::BTreeMap<(String, bool), f64> = Default::default();
    let mut detail = Vec::new();
    for line in metrics.lines() {
        // Reconciles per pod, by kind and direction: the work behind the requests.
        if let Some(rest) = line.strip_prefix("vcp_syncer_sync_duration_seconds_count{")
            && let Some((labels, value)) = rest.split_once("} ")
            && let Ok(n) = value.trim().parse::<f64>()
            && n / pods as f64 >= 0.005
        {
            let labels: String = labels.chars().filter(|c| *c != '"').collect();
            detail.push(format!("syncs:{labels}={:.2}", n / pods as f64));
        }
        let Some(rest) = line.strip_prefix("vcp_syncer_api_requests_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let label = |k: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{k}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        let (side, verb, resource) = (label("side"), label("verb"), label("resource"));
        let Ok(n) = value.trim().parse::<f64>() else {
            continue;
        };
        if verb == "watch" {
            continue;
        }
        let write = !matches!(verb.as_str(), "get" | "list");
        *sums.entry((side.clone(), write)).or_insert(0.0) += n;
        if write && side == "tenant" {
            // Writes of the pods themselves (binding, status, Events of a pod) apart from the
            // virtual nodes' upkeep, which grows with nodes and time, not with pods.
            let key = if resource.starts_with("nodes") {
                "tenant-nodes"
            } else {
                "tenant-pods"
            };
            *sums.entry((key.to_owned(), true)).or_insert(0.0) += n;
        }
        // Series below 0.005 per pod (watch restarts, the periodic upkeep) would only be noise.
        if n / pods as f64 >= 0.005 {
            detail.push(format!("{side}:{verb}:{resource}={:.2}", n / pods as f64));
        }
    }
    let per = |side: &str, write: bool| {
        sums.get(&(side.to_owned(), write)).copied().unwrap_or(0.0) / pods as f64
    };
    detail.sort();
    let line = format!(
        "bench-sync-requests pods={pods} tenant_writes_per_pod={:.2} tenant_pod_writes_per_pod={:.2} tenant_node_writes={:.0} tenant_reads_per_pod={:.2} host_writes_per_pod={:.2} host_reads_per_pod={:.2} {}",
        per("tenant", true),
        per("tenant-pods", true),
        per("tenant-nodes", true) * pods as f64,
        per("tenant", false),
        per("host", true),
        per("host", false),
        detail.join(" ")
    );
    (line, per("tenant", true), per("host", true))
}

/// Runs the benchmark and prints its summary line.
pub async fn sync(b: SyncBench) -> anyhow::Result<()> {
    // A fresh cluster in a temporary directory, gone when the benchmark ends. The direct
    // phase's pods stay while the synced ones run, so the kwok workers must hold both: each
    // takes 4,000 pods and hands out IPs from a /20.
    let pods_on_host = 2 * b.pods + b.latency_pods;
    let workers = u32::try_from(pods_on_host.div_ceil(3500))
        .unwrap_or(16)
        .clamp(3, 16);
    let cluster = DevCluster::start_workers(workers).await?;
    let (mut tenant_cp, mut syncer) = (None, None);
    let run = sync_on(&b, &cluster, &mut tenant_cp, &mut syncer).await;
    if let Err(e) = &run {
        // A failure mid-run (CI once saw only "error reading from server: EOF") is explained
        // by which process died and what it said last.
        eprintln!("bench sync failed: {e:#}\n{}", cluster.postmortem());
        if let Some(t) = &tenant_cp {
            eprintln!("{}", t.postmortem());
        }
        if let Some(s) = &syncer {
            eprintln!(
                "{}",
                vcp_dev::process::postmortem(std::slice::from_ref(s), 8)
            );
        }
    }
    run
}

/// [`sync`] on a started host cluster; the tenant's control plane and syncer go into the
/// slots so the caller can report on them when this fails.
async fn sync_on(
    b: &SyncBench,
    cluster: &DevCluster,
    tenant_slot: &mut Option<TenantControlPlane>,
    syncer_slot: &mut Option<vcp_dev::process::Spawned>,
) -> anyhow::Result<()> {
    let host = cluster.connect().await?;
    let cpu_host = descendants_cpu();

    namespace(&host, "bench-direct").await?;
    let direct_s = burst(&host, "bench-direct", b.pods, b.concurrency, false).await?;
    eprintln!("direct: {} pods Running in {direct_s:.1}s", b.pods);
    let cpu_direct = descendants_cpu();

    let tenant_cp = &*tenant_slot.insert(TenantControlPlane::start("bench").await?);
    // A port picked here so /metrics can be read at the end.
    let [port] = vcp_dev::process::free_ports()?;
    let metrics_addr = format!("127.0.0.1:{port}");
    let listen = format!("--listen={metrics_addr}");
    let binary = match &b.syncer {
        Some(p) => p.clone(),
        None => vcp_dev::tenant::syncer_binary()?,
    };
    // The bench creates more pods than the default tenant quota (100) admits; quota is not
    // what it measures.
    let policy = tenant_cp.policy_flag("quota: {}")?;
    let syncer = syncer_slot.insert(tenant_cp.start_syncer_binary(
        cluster,
        &binary,
        &["--workers=32", &listen, &policy],
    )?);
    let tenant = tenant_cp.connect().await?;
    namespace(&tenant, "burst").await?;
    // The syncer idle, its caches listed: memory per pod is what it grows by from here.
    tokio::time::sleep(Duration::from_secs(2)).await;
    // A syncer that exited at start (an old build refusing a flag the harness passes) would
    // leave the burst waiting for pods that never go down: say so, with its log's end.
    syncer.check_running()?;
    let (idle_rss_mib, _) = proc_usage(syncer.pid);
    let cpu_synced_start = descendants_cpu();
    let synced_s = burst(&tenant, "burst", b.pods, b.concurrency, b.tokens).await?;
    let cpu_synced = descendants_cpu();
    eprintln!(
        "synced: {} pods Running in the tenant in {synced_s:.1}s",
        b.pods
    );

    namespace(&tenant, "lat").await?;
    let seen = Arc::new(Mutex::new(Seen::default()));
    // The host namespace appears once the syncer has seen the tenant one.
    let host_ns: Api<Namespace> = Api::all(host.clone());
    while host_ns
        .get_opt("bench-lat")
        .await
        .context("waiting for the host namespace of the tenant's `lat`")?
        .is_none()
    {
        syncer.check_running()?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let watches = [
        watch_into(host.clone(), "bench-lat".into(), seen.clone(), true),
        watch_into(tenant.clone(), "lat".into(), seen.clone(), false),
    ];
    tokio::time::sleep(Duration::from_millis(500)).await;
    let api: Api<Pod> = Api::namespaced(tenant.clone(), "lat");
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / b.rate.max(1) as f64));
    for i in 0..b.latency_pods {
        tick.tick().await;
        let name = format!("l-{i}");
        api.create(&PostParams::default(), &pod(&name, "lat", b.tokens))
            .await
            .with_context(|| format!("creating latency pod {name} in the tenant"))?;
        seen.lock()
            .unwrap_or_else(|e| e.into_inner())
            .created
            .insert(name, Instant::now());
    }
    let start = Instant::now();
    loop {
        let done = seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .tenant_running
            .len();
        if done >= b.latency_pods {
            break;
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(600),
            "latency pods not Running after 10 min ({done} of {})",
            b.latency_pods
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for w in watches {
        w.abort();
    }
    let (rss_mib, cpu_s) = proc_usage(syncer.pid);
    let cpu_latency = descendants_cpu();
    let metrics = scrape(&metrics_addr).await;
    let s = seen.lock().unwrap_or_else(|e| e.into_inner());
    let ms = |a: &Instant, b: &Instant| b.saturating_duration_since(*a).as_secs_f64() * 1000.0;
    let down: Vec<f64> = s
        .created
        .iter()
        .filter_map(|(n, c)| Some(ms(c, s.host_seen.get(n)?)))
        .collect();
    let up: Vec<f64> = s
        .host_running
        .iter()
        .filter_map(|(n, h)| Some(ms(h, s.tenant_running.get(n)?)))
        .collect();
    let total = b.pods + b.latency_pods;
    let direct_cpu = cpu_between(&cpu_host, &cpu_host, &cpu_direct);
    let synced_cpu = cpu_between(&cpu_host, &cpu_synced_start, &cpu_synced);
    // The host apiserver's CPU for the same pods is the yardstick of what syncing them costs
    // (the benchmark's own clusters: `kube-apiserver-` is the host's, the tenant's is prefixed).
    let share = match (
        synced_cpu.get("vcp-syncer"),
        synced_cpu.get("kube-apiserver-"),
    ) {
        (Some(s), Some(a)) if *a > 0.0 => Some(s / a),
        _ => None,
    };
    // Over a fixed 40 MiB base (what the figure always meant, so runs stay comparable): the
    // growth from the idle syncer (printed beside it) also holds the allocator's arenas sized by
    // the 32 reconciles in flight, which a few hundred pods do not amortize.
    let kib_per_pod = (rss_mib - 40.0).max(0.0) * 1024.0 / total as f64;
    println!(
        "bench-sync pods={} direct_s={direct_s:.2} synced_s={synced_s:.2} throughput_ratio={:.2} syncer_share={} down_p50_ms={:.1} down_p99_ms={:.1} up_p50_ms={:.1} up_p99_ms={:.1} syncer_rss_mib={rss_mib:.1} syncer_idle_rss_mib={idle_rss_mib:.1} syncer_cpu_s={cpu_s:.1} rss_kib_per_pod={kib_per_pod:.1} latency_pods={} rate={} tokens={} syncer_build={}",
        b.pods,
        direct_s / synced_s,
        share.map_or("?".into(), |s| format!("{s:.3}")),
        percentile(down.clone(), 0.5),
        percentile(down, 0.99),
        percentile(up.clone(), 0.5),
        percentile(up, 0.99),
        b.latency_pods,
        b.rate,
        b.tokens,
        // The build profile is the binary's directory under target/ (debug or release).
        binary
            .parent()
            .and_then(|d| d.file_name())
            .map_or("?".into(), |d| d.to_string_lossy()),
    );
    let mut measured = SyncLimits {
        syncer_share: share,
        kib_per_pod: Some(kib_per_pod),
        ..Default::default()
    };
    match metrics {
        Ok(m) => {
            let (line, tenant_writes, host_writes) = requests_line(&m, total);
            println!("{line}");
            measured.tenant_writes_per_pod = Some(tenant_writes);
            measured.host_writes_per_pod = Some(host_writes);
        }
        Err(e) => eprintln!("could not read the syncer's metrics: {e}"),
    }
    // What the two throughput phases cost the machine, whatever else ran on it meanwhile.
    let work_ratio = direct_cpu.values().sum::<f64>() / synced_cpu.values().sum::<f64>();
    println!(
        "bench-sync-cpu work_ratio={work_ratio:.2} {} {} {}",
        cpu_line("direct", &direct_cpu),
        cpu_line("synced", &synced_cpu),
        cpu_line(
            "latency",
            &cpu_between(&cpu_host, &cpu_synced, &cpu_latency)
        ),
    );
    let exceeded = b.limits.exceeded(&measured);
    anyhow::ensure!(
        exceeded.is_empty(),
        "bench sync: over the limits: {}",
        exceeded.join(" ")
    );
    Ok(())
}

/// A fresh cluster in a temporary directory (gone when the benchmark ends) with a real
/// `vcp serve` on its Postgres, and an admin client of it.
/// A fresh dev cluster and a `vcp serve` on it (with `backup_prefix`: backups to the dev
/// cluster's S3 server under it).
pub(crate) async fn bench_platform(
    simulate: bool,
    workers: u16,
    extra_env: Vec<(String, String)>,
    backup_prefix: Option<String>,
) -> anyhow::Result<(
    DevCluster,
    vcp_dev::platform::Orchestrator,
    vcp_dev::platform::ApiClient,
)> {
    use vcp_dev::platform::{self, ApiClient, ServeOptions};
    let cluster = DevCluster::start().await?;
    let token = platform::new_token();
    let orch = platform::start_orchestrator(
        &cluster,
        &cluster.state_dir().join("vcp"),
        &ServeOptions {
            database_url: cluster.database_url().to_owned(),
            admin_token: token.clone(),
            replica_id: "vcp-bench".into(),
            workers,
            port: None,
            simulate,
            extra_env,
            backup_prefix,
        },
        Supervision::Attached,
    )
    .await?;
    let api = ApiClient::new(&orch.url, &token);
    Ok((cluster, orch, api))
}

/// `bench provision` settings.
#[derive(Debug, Clone)]
pub struct ProvisionBench {
    pub tenants: usize,
    pub simulate: bool,
    pub workers: u16,
    pub idle_seconds: u64,
}

/// Creates N tenants at once through a real `vcp serve` and reports how long each took to
/// become Ready, where that time went step by step, and what vcp itself costs: RSS and CPU,
/// in total and per idle tenant.
///
/// The steps (p50 across tenants, docs/benchmarks.md says the same):
/// - `pki_s`, `render_apply_s`: the work of the tenant's first pass as vcp logs it (its pass
///   log line's `work` field: `pki`; `etcd` + `apiserver`, render, apply and a readiness read).
/// - `etcd_s`, `apiserver_s`: from `CertificatesReady` turning True to `EtcdReady`,
///   `ApiserverReady` turning True (the conditions' `last_transition_time`, which a pass sets
///   when it sees the step's result; the apiserver's includes its revocation authorizer
///   answering it); `controller_manager_s`, `coredns_s`, `syncer_s` (the syncer rolled out): from
///   `Bootstrapped` (the apiserver answered) to theirs. `at_*_s`: the same conditions from
///   the tenant's `created_at`, which shows the critical path.
/// - `kubeconfig_s`: `POST /v1/tenants/{name}/kubeconfigs` timed by the benchmark, issued as
///   soon as it sees the tenant Ready.
///
/// And what the bring-up cost the machine, from the first create to the last Ready:
/// `bringup_cpu_s`, CPU seconds of the benchmark's process tree (host cluster, devnode, the
/// control planes, vcp), and `machine_cpu_s`, busy CPU seconds of the whole machine
/// (/proc/stat), so other work sharing the `cores` shows.
pub async fn provision(b: ProvisionBench) -> anyhow::Result<()> {
    let (cluster, orch, api) = bench_platform(
        b.simulate,
        b.workers,
        vec![("VCP_LOG_FORMAT".into(), "json".into())],
        None,
    )
    .await?;
    let (base_rss, base_cpu) = proc_usage(orch.proc.pid);
    let (tree_before, machine_before) = (descendants_cpu(), machine_busy_cpu());
    let start = Instant::now();
    let mut created = Vec::new();
    for i in 0..b.tenants {
        let name = format!("t{i}");
        api.create_tenant(&name).await?;
        created.push((name, start.elapsed()));
    }
    let mut ready: std::collections::BTreeMap<String, Duration> = Default::default();
    let mut kubeconfig: Vec<f64> = Vec::new();
    let deadline = Duration::from_secs(600 + 2 * b.tenants as u64);
    while ready.len() < b.tenants {
        let (_, list) = api.raw(reqwest::Method::GET, "/v1/tenants", None).await?;
        let mut new = Vec::new();
        for t in list["items"].as_array().into_iter().flatten() {
            let name = t["name"].as_str().unwrap_or_default();
            if t["phase"] == "Failed" {
                anyhow::bail!("tenant {name} failed: {t}");
            }
            if t["phase"] == "Ready" && !ready.contains_key(name) {
                ready.insert(name.to_owned(), start.elapsed());
                new.push(name.to_owned());
            }
        }
        // A user's first call once the tenant is Ready: vcp signs with the tenant CA it
        // reads from the host.
        for name in new {
            let clock = Instant::now();
            api.kubeconfig(&name, "bench", &["view"], "1h").await?;
            kubeconfig.push(clock.elapsed().as_secs_f64());
        }
        if start.elapsed() > deadline {
            anyhow::bail!(
                "{} of {} tenants Ready after {deadline:?}",
                ready.len(),
                b.tenants
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let all_ready_s = start.elapsed().as_secs_f64();
    // CPU over the bring-up: this benchmark's process tree (host cluster, devnode, every
    // control plane, vcp), and the whole machine's (the difference is other work on it).
    let by_process = cpu_between(&tree_before, &tree_before, &descendants_cpu());
    let tree_cpu: f64 = by_process.values().sum();
    // Which processes spent it (stderr: the summary stays one line).
    eprintln!("{}", cpu_line("bringup_cpu", &by_process));
    let machine_cpu = machine_busy_cpu() - machine_before;
    let took: Vec<f64> = created
        .iter()
        .map(|(n, c)| (ready[n] - *c).as_secs_f64())
        .collect();
    let (rss_mib, cpu_s) = proc_usage(orch.proc.pid);
    let mut timelines = Vec::new();
    for (name, _) in &created {
        let t = api
            .get_tenant(name)
            .await?
            .with_context(|| format!("tenant {name} is gone"))?;
        timelines.push(Timeline::of(&t));
    }
    let log = std::fs::read_to_string(cluster.state_dir().join("vcp").join("vcp-bench.log"))
        .unwrap_or_default();
    let work = first_pass_work(&log);
    // Idle: every tenant Ready, vcp only re-checking them on its schedule.
    tokio::time::sleep(Duration::from_secs(b.idle_seconds)).await;
    let (idle_rss, idle_cpu) = proc_usage(orch.proc.pid);
    let idle_mcpu_per_tenant =
        (idle_cpu - cpu_s) * 1000.0 / b.idle_seconds as f64 / b.tenants as f64;
    let p50 = |v: Vec<f64>| {
        if v.is_empty() {
            "na".to_owned()
        } else {
            format!("{:.2}", percentile(v, 0.5))
        }
    };
    let from = |cond: &str, since: &str| {
        p50(timelines
            .iter()
            .filter_map(|t| Some(t.at(cond)? - t.at(since)?))
            .collect())
    };
    let work_of = |parts: &[&str]| {
        p50(created
            .iter()
            .filter_map(|(n, _)| {
                let w = work.get(n)?;
                Some(
                    parts
                        .iter()
                        .map(|p| w.get(*p).copied().unwrap_or(0.0))
                        .sum(),
                )
            })
            .collect())
    };
    let mut steps = vec![
        ("pki_s", work_of(&["pki"])),
        ("render_apply_s", work_of(&["etcd", "apiserver"])),
        ("etcd_s", from("EtcdReady", "CertificatesReady")),
        ("apiserver_s", from("ApiserverReady", "CertificatesReady")),
        (
            "controller_manager_s",
            from("ControllerManagerReady", "Bootstrapped"),
        ),
        ("coredns_s", from("DnsReady", "Bootstrapped")),
        ("syncer_s", from("SyncerReady", "Bootstrapped")),
        ("kubeconfig_s", p50(kubeconfig)),
    ];
    for (key, cond) in [
        ("at_certificates_s", "CertificatesReady"),
        ("at_etcd_s", "EtcdReady"),
        ("at_apiserver_s", "ApiserverReady"),
        ("at_bootstrapped_s", "Bootstrapped"),
        ("at_controller_manager_s", "ControllerManagerReady"),
        ("at_coredns_s", "DnsReady"),
        ("at_syncer_s", "SyncerReady"),
        ("at_ready_s", "Ready"),
    ] {
        steps.push((key, from(cond, "")));
    }
    let steps: Vec<String> = steps.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!(
        "bench-provision tenants={} simulate={} ready_p50_s={:.2} ready_p99_s={:.2} all_ready_s={all_ready_s:.1} {} bringup_cpu_s={tree_cpu:.1} machine_cpu_s={machine_cpu:.1} cores={} orchestrator_rss_mib={rss_mib:.1} orchestrator_cpu_s={:.1} idle_rss_kib_per_tenant={:.0} idle_mcpu_per_tenant={idle_mcpu_per_tenant:.3} idle_window_s={}",
        b.tenants,
        b.simulate,
        percentile(took.clone(), 0.5),
        percentile(took, 0.99),
        steps.join(" "),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_s - base_cpu,
        (idle_rss - base_rss).max(0.0) * 1024.0 / b.tenants as f64,
        b.idle_seconds,
    );
    drop(orch);
    Ok(())
}

/// When a tenant's conditions last turned True, from its API representation (seconds since
/// its `created_at`; the empty name is `created_at` itself).
struct Timeline(std::collections::BTreeMap<String, f64>);

impl Timeline {
    fn of(t: &serde_json::Value) -> Timeline {
        let ts = |v: &serde_json::Value| {
            v.as_str()?
                .parse::<k8s_openapi::jiff::Timestamp>()
                .ok()
                .map(|t| t.as_millisecond() as f64 / 1000.0)
        };
        let mut m = std::collections::BTreeMap::new();
        if let Some(created) = ts(&t["created_at"]) {
            m.insert(String::new(), 0.0);
            for c in t["conditions"].as_array().into_iter().flatten() {
                if c["status"] == "True"
                    && let (Some(ty), Some(at)) =
                        (c["type"].as_str(), ts(&c["last_transition_time"]))
                {
                    m.insert(ty.to_owned(), at - created);
                }
            }
        }
        Timeline(m)
    }

    fn at(&self, condition: &str) -> Option<f64> {
        self.0.get(condition).copied()
    }
}

/// Per tenant, the `work` of its first bring-up pass (the first pass log line that has one),
/// in seconds per part, from vcp's JSON log: `"work": "namespace=3ms pki=412ms ..."`.
fn first_pass_work(
    log: &str,
) -> std::collections::BTreeMap<String, std::collections::BTreeMap<String, f64>> {
    let mut out = std::collections::BTreeMap::new();
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let f = &v["fields"];
        if f["message"] != "pass" {
            continue;
        }
        let (Some(tenant), Some(work)) = (f["tenant"].as_str(), f["work"].as_str()) else {
            continue;
        };
        if work.is_empty() || out.contains_key(tenant) {
            continue;
        }
        let parts = work
            .split_whitespace()
            .filter_map(|p| {
                let (k, ms) = p.split_once('=')?;
                Some((
                    k.to_owned(),
                    ms.strip_suffix("ms")?.parse::<f64>().ok()? / 1000.0,
                ))
            })
            .collect();
        out.insert(tenant.to_owned(), parts);
    }
    out
}

/// `bench upgrade` settings.
#[derive(Debug, Clone)]
pub struct UpgradeBench {
    pub tenants: usize,
    pub simulate: bool,
    pub workers: u16,
    pub max_parallel: u32,
    /// Past these the run fails (CI's guard); `None`: not checked.
    pub limits: UpgradeLimits,
}

/// Busy and total jiffies of the whole machine (every core), from the first line of
/// /proc/stat: busy is everything but idle and iowait.
fn machine_jiffies() -> (f64, f64) {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return (f64::NAN, f64::NAN);
    };
    let f: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: f64 = f.iter().take(8).sum();
    let idle = f.get(3).copied().unwrap_or(0.0) + f.get(4).copied().unwrap_or(0.0);
    (total - idle, total)
}

/// Reaped children's CPU seconds (`cutime` + `cstime`) of a process: what its exited children
/// used (Postgres backends that ended, mostly).
fn reaped_cpu(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let f: Vec<f64> = s[s.rfind(')')? + 2..]
                .split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect();
            Some((f.get(13)? + f.get(14)?) / 100.0)
        })
        .unwrap_or(0.0)
}

/// The benchmark's processes, grouped for the summary line by their command name (/proc
/// truncates it to 15 characters, and the cached binaries carry their version:
/// `kube-apiserver-v1.37.1` shows as `kube-apiserver-`).
fn cpu_group(comm: &str) -> &'static str {
    const GROUPS: [(&str, &str); 8] = [
        ("postgres", "pg"),
        ("kube-apiserver", "apiserver"),
        ("etcd", "etcd"),
        ("kube-controller", "kcm"),
        ("kube-scheduler", "scheduler"),
        ("kwok", "kwok"),
        ("vcp-dev", "bench"),
        ("vcp", "vcp"),
    ];
    GROUPS
        .iter()
        .find(|(prefix, _)| {
            comm == *prefix
                || comm
                    .strip_prefix(prefix)
                    .is_some_and(|r| r.starts_with('-'))
        })
        .map_or("other", |(_, g)| g)
}

/// CPU seconds of the benchmark's process tree (this process and its descendants) between
/// two snapshots, by [`cpu_group`]; a process that exited between them is lost, except what
/// its parent reaped (added by the caller for Postgres).
fn grouped_cpu(
    from: &HashMap<u32, (String, f64)>,
    to: &HashMap<u32, (String, f64)>,
) -> std::collections::BTreeMap<&'static str, f64> {
    let mut out = std::collections::BTreeMap::new();
    for (pid, (comm, cpu)) in to {
        let before = from.get(pid).map_or(0.0, |(_, c)| *c);
        *out.entry(cpu_group(comm)).or_insert(0.0) += cpu - before;
    }
    out
}

/// A counter's value in Prometheus text (`name value`), 0 if absent.
fn counter(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// `vcp serve`'s `/metrics`: passes run and seconds spent in them.
async fn pass_counters(url: &str) -> (f64, f64) {
    let text = match reqwest::get(format!("{url}/metrics")).await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    (
        counter(&text, "vcp_reconcile_passes_total"),
        counter(&text, "vcp_reconcile_pass_seconds_total"),
    )
}

/// One fleet entry's times, from the inventory: when the fleet started it, when its upgrade's
/// hop started (the snapshot taken), when the upgrade ended, and when the fleet recorded that.
struct EntryTimes {
    started: time::OffsetDateTime,
    hop_started: time::OffsetDateTime,
    upgrade_finished: time::OffsetDateTime,
    recorded: time::OffsetDateTime,
    wave: i32,
}

async fn entry_times(db: &str, fleet: i64) -> anyhow::Result<Vec<EntryTimes>> {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(db).await?;
    type Row = (
        time::OffsetDateTime,
        time::OffsetDateTime,
        time::OffsetDateTime,
        time::OffsetDateTime,
        i32,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT e.started_at, u.hop_started_at, u.finished_at, e.finished_at, e.wave
         FROM fleet_upgrade_tenants e JOIN tenant_upgrades u ON u.id = e.upgrade_id
         WHERE e.fleet_id = $1 AND e.started_at IS NOT NULL AND e.finished_at IS NOT NULL
           AND u.finished_at IS NOT NULL",
    )
    .bind(fleet)
    .fetch_all(&mut conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(started, hop_started, upgrade_finished, recorded, wave)| EntryTimes {
                started,
                hop_started,
                upgrade_finished,
                recorded,
                wave,
            },
        )
        .collect())
}

/// N tenants on 1.36 moved to 1.37 by one fleet upgrade (canary 1, no soak) through a real
/// `vcp serve`: the fleet's wall time, each tenant's upgrade time (from its fleet entry's start
/// to its end), failures, vcp's RSS and CPU over the upgrade, and where the wall time went:
///
/// - CPU seconds over the upgrade of each part of the benchmark's process tree (vcp, its
///   Postgres, the host apiserver, etcd, controller-manager, scheduler, kwok) and how busy
///   the machine's cores were (all processes, the benchmark's or not);
/// - each tenant's time split in three, from the inventory: `snap` (fleet start to the hop's
///   start: the pass that takes the snapshot), `roll` (the hop's start to the upgrade's end:
///   the components rolling, one step after another, and the gates), `notice` (the upgrade's
///   end to the fleet recording it: the fleet worker's poll);
/// - `slots_busy_pct`: the share of the `max_parallel` slots over the wall time that held a
///   moving tenant (the rest is waves' tails, the canary, and starts not yet made);
/// - `pass_s`: seconds vcp's workers spent in reconcile passes (its `/metrics`), and
///   `workers_busy_pct` that over `workers` x wall time (near 100: tenants queue for workers).
pub async fn upgrade(b: UpgradeBench) -> anyhow::Result<()> {
    let (cluster, orch, api) = bench_platform(b.simulate, b.workers, vec![], None).await?;
    let bench_start = Instant::now();
    for i in 0..b.tenants {
        let (s, t) = api
            .raw(
                reqwest::Method::POST,
                "/v1/tenants",
                Some(&serde_json::json!({"name": format!("u{i}"), "version": "1.36"})),
            )
            .await?;
        anyhow::ensure!(s == 201, "create u{i}: {s} {t}");
    }
    let deadline = Duration::from_secs(600 + 2 * b.tenants as u64);
    let start = Instant::now();
    loop {
        let (_, list) = api.raw(reqwest::Method::GET, "/v1/tenants", None).await?;
        let items = list["items"].as_array().cloned().unwrap_or_default();
        let ready = items.iter().filter(|t| t["phase"] == "Ready").count();
        if ready == b.tenants {
            break;
        }
        anyhow::ensure!(
            start.elapsed() < deadline,
            "{ready} of {} tenants Ready after {deadline:?}",
            b.tenants
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "bench upgrade: {} tenants Ready on 1.36 after {:.1}s; upgrading",
        b.tenants,
        start.elapsed().as_secs_f64()
    );

    let (rss_before, cpu_before) = proc_usage(orch.proc.pid);
    let procs_before = descendants_cpu();
    let pg_pid = |procs: &HashMap<u32, (String, f64)>| {
        // The postmaster: the one `postgres` whose parent is not a `postgres`.
        procs.iter().find_map(|(pid, (comm, _))| {
            (comm == "postgres"
                && std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .ok()
                    .and_then(|s| {
                        let ppid: u32 = s[s.rfind(')')? + 2..]
                            .split_whitespace()
                            .nth(1)?
                            .parse()
                            .ok()?;
                        Some(procs.get(&ppid).is_none_or(|(c, _)| c != "postgres"))
                    })
                    .unwrap_or(false))
            .then_some(*pid)
        })
    };
    let postmaster = pg_pid(&procs_before);
    let reaped_before = postmaster.map_or(0.0, reaped_cpu);
    let machine_before = machine_jiffies();
    let passes_before = pass_counters(&orch.url).await;
    let start = Instant::now();
    let (s, f) = api
        .raw(
            reqwest::Method::POST,
            "/v1/upgrades",
            Some(&serde_json::json!({
                "target": "1.37",
                "canary": 1,
                "max_parallel": b.max_parallel,
                "failure_budget": b.tenants,
                "soak_seconds": 0,
                "respect_maintenance_windows": false,
            })),
        )
        .await?;
    anyhow::ensure!(s == 201, "fleet upgrade: {s} {f}");
    // The detail is the fleet upgrade's fields with its `tenants` beside them.
    let id = f["id"]
        .as_i64()
        .ok_or_else(|| anyhow::anyhow!("no id in {f}"))?;
    let mut peak_rss = rss_before;
    let detail = loop {
        let (_, d) = api
            .raw(reqwest::Method::GET, &format!("/v1/upgrades/{id}"), None)
            .await?;
        peak_rss = peak_rss.max(proc_usage(orch.proc.pid).0);
        let u = &d;
        let finished =
            ["Succeeded", "Failed", "Cancelled"].contains(&u["state"].as_str().unwrap_or(""));
        if finished && u["progress"]["running"] == 0 {
            break d;
        }
        anyhow::ensure!(
            start.elapsed() < deadline,
            "fleet upgrade {id} not finished after {deadline:?}: {} {}",
            u["state"],
            u["progress"]
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let total_s = start.elapsed().as_secs_f64();
    let (_, cpu_after) = proc_usage(orch.proc.pid);
    let procs_after = descendants_cpu();
    let machine_after = machine_jiffies();
    let passes_after = pass_counters(&orch.url).await;
    let mut cpu = grouped_cpu(&procs_before, &procs_after);
    *cpu.entry("pg").or_insert(0.0) += postmaster.map_or(0.0, reaped_cpu) - reaped_before;
    let cpu_of = |g: &str| cpu.get(g).copied().unwrap_or(0.0);
    let parse = |v: &serde_json::Value| {
        v.as_str().and_then(|s| {
            time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()
        })
    };
    let tenants = detail["tenants"].as_array().cloned().unwrap_or_default();
    let took: Vec<f64> = tenants
        .iter()
        .filter_map(|t| {
            Some((parse(&t["finished_at"])? - parse(&t["started_at"])?).as_seconds_f64())
        })
        .collect();
    let failed = tenants.iter().filter(|t| t["state"] != "Succeeded").count();
    let times = entry_times(cluster.database_url(), id).await?;
    let secs = |f: &dyn Fn(&EntryTimes) -> time::Duration| -> Vec<f64> {
        times.iter().map(|e| f(e).as_seconds_f64()).collect()
    };
    let snap = secs(&|e| e.hop_started - e.started);
    let roll = secs(&|e| e.upgrade_finished - e.hop_started);
    let notice = secs(&|e| e.recorded - e.upgrade_finished);
    let busy_slot_s: f64 = took.iter().sum();
    let slots_busy_pct = 100.0 * busy_slot_s / (f64::from(b.max_parallel) * total_s);
    let waves = times.iter().map(|e| e.wave + 1).max().unwrap_or(0);
    let (passes, pass_s) = (
        passes_after.0 - passes_before.0,
        passes_after.1 - passes_before.1,
    );
    let workers_busy_pct = 100.0 * pass_s / (f64::from(b.workers) * total_s);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let machine_busy_pct =
        100.0 * (machine_after.0 - machine_before.0) / (machine_after.1 - machine_before.1);
    let vcp_cpu = cpu_after - cpu_before;
    let vcp_share = vcp_cpu / cpu_of("apiserver");
    println!(
        "bench-upgrade tenants={} simulate={} max_parallel={} workers={} total_s={total_s:.1} per_tenant_p50_s={:.1} per_tenant_p99_s={:.1} failed={failed} vcp_share={vcp_share:.2} vcp_rss_mib={peak_rss:.1} vcp_cpu_s={:.1} pg_cpu_s={:.1} apiserver_cpu_s={:.1} etcd_cpu_s={:.1} kcm_cpu_s={:.1} scheduler_cpu_s={:.1} kwok_cpu_s={:.1} other_cpu_s={:.1} machine_busy_pct={machine_busy_pct:.0} cores={cores} snap_p50_s={:.1} roll_p50_s={:.1} roll_p99_s={:.1} notice_p50_s={:.1} waves={waves} slots_busy_pct={slots_busy_pct:.0} passes={passes:.0} pass_s={pass_s:.0} workers_busy_pct={workers_busy_pct:.0} setup_s={:.0}",
        b.tenants,
        b.simulate,
        b.max_parallel,
        b.workers,
        percentile(took.clone(), 0.5),
        percentile(took, 0.99),
        vcp_cpu,
        cpu_of("pg"),
        cpu_of("apiserver"),
        cpu_of("etcd"),
        cpu_of("kcm"),
        cpu_of("scheduler"),
        cpu_of("kwok"),
        cpu_of("other") + cpu_of("bench"),
        percentile(snap, 0.5),
        percentile(roll.clone(), 0.5),
        percentile(roll, 0.99),
        percentile(notice, 0.5),
        (bench_start.elapsed().as_secs_f64() - total_s),
    );
    drop(orch);
    // Every tenant of the fleet must have an outcome: one that never finished counts as failed.
    let failed = failed + b.tenants.saturating_sub(tenants.len());
    let exceeded = b.limits.exceeded(&UpgradeLimits {
        failed: Some(failed as f64),
        vcp_share: vcp_share.is_finite().then_some(vcp_share),
    });
    anyhow::ensure!(
        exceeded.is_empty(),
        "bench upgrade: over the limits: {}",
        exceeded.join(" ")
    );
    Ok(())
}

pub struct KubeletBench {
    /// Size of the container log read whole, in MiB.
    pub log_mib: usize,
    /// `kubectl exec` round trips per side.
    pub execs: usize,
}

/// `vcp-dev bench kubelet`: the kubelet API through a tenant (its apiserver, the syncer's
/// kubelet endpoint, the host apiserver, kwok) against the same calls made on the host pod
/// directly (host apiserver, kwok). Log throughput: a `log_mib` MiB container log read whole
/// through each, three times alternating, the median. Exec: `kubectl exec -- true` round trips
/// (kubectl's own start included on both sides), p50 and p99. Ratios are tenant over host.
pub async fn kubelet(b: KubeletBench) -> anyhow::Result<()> {
    let cluster = DevCluster::start().await?;
    let host = cluster.connect().await?;
    // kwok serves this file as the log of any container not named `side` or `follow`.
    let log = cluster.state_dir().join(vcp_dev::kwok::DIR).join("app.log");
    let line = format!(
        "{} stdout F {}\n",
        k8s_openapi::jiff::Timestamp::now(),
        "x".repeat(200)
    );
    let lines = (b.log_mib << 20) / line.len();
    std::fs::write(&log, line.repeat(lines))?;

    let cp = TenantControlPlane::start("bench").await?;
    let _syncer = cp.start_syncer(&cluster, &[])?;
    let tenant = cp.connect().await?;
    namespace(&tenant, "kubelet").await?;
    let sas: Api<ServiceAccount> = Api::namespaced(tenant.clone(), "kubelet");
    while sas.get_opt("default").await?.is_none() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let tenant_pods: Api<Pod> = Api::namespaced(tenant.clone(), "kubelet");
    tenant_pods
        .create(&PostParams::default(), &pod("web", "web", false))
        .await?;
    let start = Instant::now();
    while !tenant_pods.get("web").await.is_ok_and(|p| running(&p)) {
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(120),
            "the tenant pod never ran"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let host_pods: Api<Pod> = Api::namespaced(host.clone(), "bench-kubelet");
    let container = pod("web", "web", false).spec.unwrap().containers[0]
        .name
        .clone();
    let params = kube::api::LogParams {
        container: Some(container.clone()),
        ..Default::default()
    };

    // What the log serves of each line: its content and a newline, not the CRI prefix.
    let expected = lines * 201;
    let read = |api: Api<Pod>| {
        let params = params.clone();
        async move {
            let t = Instant::now();
            let text = api.logs("web", &params).await?;
            let secs = t.elapsed().as_secs_f64();
            anyhow::ensure!(
                text.len() + 4096 >= expected,
                "short log: {} bytes",
                text.len()
            );
            anyhow::Ok(text.len() as f64 / (1 << 20) as f64 / secs)
        }
    };
    let (mut host_mib_s, mut tenant_mib_s) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        host_mib_s.push(read(host_pods.clone()).await?);
        tenant_mib_s.push(read(tenant_pods.clone()).await?);
    }
    let (host_mib_s, tenant_mib_s) = (percentile(host_mib_s, 0.5), percentile(tenant_mib_s, 0.5));
    eprintln!("log: host {host_mib_s:.1} MiB/s, tenant {tenant_mib_s:.1} MiB/s");

    let exec = |kubeconfig: std::path::PathBuf, ns: &'static str| {
        let kubectl = cluster.kubectl();
        let container = container.clone();
        move || -> anyhow::Result<f64> {
            let t = Instant::now();
            let out = std::process::Command::new(&kubectl)
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .args(["-n", ns, "exec", "web", "-c", &container, "--", "true"])
                .output()?;
            anyhow::ensure!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            Ok(t.elapsed().as_secs_f64() * 1000.0)
        }
    };
    let host_exec = exec(cluster.kubeconfig_path().to_owned(), "bench-kubelet");
    let tenant_exec = exec(cp.kubeconfig.clone(), "kubelet");
    let (mut host_ms, mut tenant_ms) = (Vec::new(), Vec::new());
    for _ in 0..b.execs {
        host_ms.push(host_exec()?);
        tenant_ms.push(tenant_exec()?);
    }
    let p = |v: &Vec<f64>, q| percentile(v.clone(), q);
    let (h50, h99, t50, t99) = (
        p(&host_ms, 0.5),
        p(&host_ms, 0.99),
        p(&tenant_ms, 0.5),
        p(&tenant_ms, 0.99),
    );
    println!(
        "bench-kubelet log_mib={} host_log_mib_s={host_mib_s:.1} tenant_log_mib_s={tenant_mib_s:.1} \
         log_ratio={:.2} execs={} host_exec_p50_ms={h50:.0} tenant_exec_p50_ms={t50:.0} \
         exec_p50_ratio={:.2} host_exec_p99_ms={h99:.0} tenant_exec_p99_ms={t99:.0} exec_p99_ratio={:.2}",
        b.log_mib,
        tenant_mib_s / host_mib_s,
        b.execs,
        t50 / h50,
        t99 / h99,
    );
    Ok(())
}

/// `bench authz` settings.
pub struct AuthzBench {
    /// GETs per kubeconfig and pass.
    pub requests: usize,
}

/// What the revocation webhook costs a request: a tenant provisioned by a real `vcp serve`,
/// then GETs of ConfigMaps that do not exist, each of a new name so no answer comes from the
/// apiserver's authorization cache, through a revocable kubeconfig (webhook, then RBAC) and a
/// break-glass one (`system:masters`: no authorizer at all), alternating passes. One line:
/// each side's median and p95, and the median added.
pub async fn authz(b: AuthzBench) -> anyhow::Result<()> {
    let (cluster, _orch, api) = bench_platform(false, 2, vec![], None).await?;
    api.create_tenant("authz").await?;
    api.wait_ready("authz", Duration::from_secs(300)).await?;
    let client = |yaml: String| async move {
        let kc = kube::config::Kubeconfig::from_yaml(&yaml)?;
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
        anyhow::Ok(Client::try_from(cfg)?)
    };
    let revocable = client(api.kubeconfig("authz", "bench", &["view"], "1h").await?).await?;
    let (status, glass) = api
        .raw(
            reqwest::Method::POST,
            "/v1/tenants/authz/break-glass",
            Some(&serde_json::json!({"reason": "vcp-dev bench authz", "ttl": "15m"})),
        )
        .await?;
    anyhow::ensure!(status == 201, "break-glass: {status} {glass}");
    let glass = client(glass["kubeconfig"].as_str().unwrap_or_default().to_owned()).await?;
    let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for pass in 0..4 {
        for (side, c) in [&revocable, &glass].into_iter().enumerate() {
            let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
                Api::namespaced(c.clone(), "default");
            for i in 0..b.requests {
                let name = format!("absent-{pass}-{side}-{i}");
                let t = Instant::now();
                let got = cms.get_opt(&name).await?;
                let ms = t.elapsed().as_secs_f64() * 1000.0;
                anyhow::ensure!(got.is_none(), "{name} exists");
                // The first pass warms connections up; it is not counted.
                if pass > 0 {
                    times[side].push(ms);
                }
            }
        }
    }
    let [webhook, none] = times;
    let (wm, wp) = (
        percentile(webhook.clone(), 0.5),
        percentile(webhook.clone(), 0.95),
    );
    let (nm, np) = (
        percentile(none.clone(), 0.5),
        percentile(none.clone(), 0.95),
    );
    println!(
        "bench-authz requests={} revocable_median_ms={wm:.2} revocable_p95_ms={wp:.2} break_glass_median_ms={nm:.2} break_glass_p95_ms={np:.2} added_median_ms={:.2}",
        webhook.len(),
        wm - nm
    );
    drop(cluster);
    Ok(())
}

/// From creating a busybox pod on the real node until it is Running (the cluster's start
/// images are already imported).
pub async fn first_pod_on_real_node(cluster: &DevCluster) -> anyhow::Result<Duration> {
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "first"},
        "spec": {
            "nodeSelector": {vcp_dev::node::NODE_LABEL.0: vcp_dev::node::NODE_LABEL.1},
            "tolerations": [{"key": vcp_dev::node::NODE_LABEL.0, "operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": vcp_dev::images::BUSYBOX_IMAGE, "command": ["sleep", "3600"]}],
        },
    }))?;
    let t = Instant::now();
    pods.create(&PostParams::default(), &pod).await?;
    loop {
        let p = pods.get("first").await?;
        if p.status.and_then(|s| s.phase).as_deref() == Some("Running") {
            return Ok(t.elapsed());
        }
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(120),
            "the first pod on the real node was not Running after 120 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_counted_per_side_with_the_nodes_upkeep_apart() {
        let metrics = r#"vcp_syncer_api_requests_total{side="tenant",verb="create",resource="pods/binding"} 100
vcp_syncer_api_requests_total{side="tenant",verb="patch",resource="pods/status"} 100
vcp_syncer_api_requests_total{side="tenant",verb="patch",resource="nodes/status"} 30
vcp_syncer_api_requests_total{side="tenant",verb="create",resource="nodes"} 3
vcp_syncer_api_requests_total{side="tenant",verb="get",resource="nodes"} 7
vcp_syncer_api_requests_total{side="tenant",verb="watch",resource="pods"} 9
vcp_syncer_api_requests_total{side="host",verb="create",resource="pods"} 100
vcp_syncer_sync_duration_seconds_count{kind="Pod",direction="down"} 650
"#;
        let (line, tenant, host) = requests_line(metrics, 100);
        assert_eq!((tenant, host), (2.33, 1.0));
        assert!(line.contains(" tenant_pod_writes_per_pod=2.00 "), "{line}");
        assert!(line.contains(" tenant_node_writes=33 "), "{line}");
        assert!(line.contains(" tenant_reads_per_pod=0.07 "), "{line}");
        assert!(
            line.contains(" syncs:kind=Pod,direction=down=6.50"),
            "{line}"
        );
    }

    #[test]
    fn a_run_fails_only_past_a_limit_it_was_given() {
        let limits = SyncLimits {
            syncer_share: Some(0.5),
            kib_per_pod: Some(40.0),
            tenant_writes_per_pod: Some(4.0),
            host_writes_per_pod: None,
        };
        let fine = SyncLimits {
            syncer_share: Some(0.12),
            kib_per_pod: Some(9.0),
            tenant_writes_per_pod: Some(2.0),
            host_writes_per_pod: Some(9.0),
        };
        assert!(limits.exceeded(&fine).is_empty(), "no limit on host writes");
        let regressed = SyncLimits {
            syncer_share: Some(3.9),
            tenant_writes_per_pod: None,
            ..fine
        };
        assert_eq!(
            limits.exceeded(&regressed),
            [
                "syncer_share=3.90>0.5",
                "tenant_writes_per_pod=unmeasured>4"
            ]
        );
        assert!(SyncLimits::default().exceeded(&regressed).is_empty());
    }

    #[test]
    fn an_upgrade_run_fails_on_a_failed_tenant_or_an_unmeasured_share() {
        let limits = UpgradeLimits {
            failed: Some(0.0),
            vcp_share: Some(1.0),
        };
        let fine = UpgradeLimits {
            failed: Some(0.0),
            vcp_share: Some(0.21),
        };
        assert!(limits.exceeded(&fine).is_empty());
        let bad = UpgradeLimits {
            failed: Some(1.0),
            vcp_share: None,
        };
        assert_eq!(
            limits.exceeded(&bad),
            ["failed=1.00>0", "vcp_share=unmeasured>1"]
        );
    }
}
