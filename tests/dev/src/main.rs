use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use vcp_dev::{Options, Supervision, cluster};

mod backup_bench;
mod bench;
mod conformance;
mod density;
mod gateway_bench;

/// A local Kubernetes host cluster for vcp: etcd, kube-apiserver, controller-manager,
/// scheduler, kwok worker nodes, a PV provisioner and Postgres, all on 127.0.0.1, and an S3
/// server for backups on the process node's gateway.
#[derive(Debug, Parser)]
#[command(name = "vcp-dev", version)]
struct Args {
    #[command(subcommand)]
    command: Command,
    /// Log as JSON lines instead of text.
    #[arg(long, env = "VCP_LOG_JSON", global = true)]
    log_json: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start the cluster in the background, install vcp into it with its Helm chart (or run
    /// it locally with --local), provision a tenant, and return once it is Ready.
    Up {
        /// Directory for state, certificates, data and logs.
        #[arg(long, env = "VCP_DEV_STATE_DIR")]
        state_dir: PathBuf,
        /// Number of simulated (kwok) worker nodes.
        #[arg(long, env = "VCP_DEV_WORKERS", default_value_t = 3)]
        workers: u32,
        /// Stay in the foreground and stop everything on Ctrl-C, SIGTERM or when killed.
        #[arg(long, env = "VCP_DEV_FOREGROUND")]
        foreground: bool,
        /// Tenant that vcp provisions; its admin kubeconfig is `<state-dir>/<name>.kubeconfig`.
        #[arg(long, env = "VCP_DEV_TENANT", default_value = "demo")]
        tenant: String,
        /// The tenant's plan (default: the platform's default plan). With --real-node,
        /// `conformance` is the plan that passes the conformance suite (docs/conformance.md).
        #[arg(long, env = "VCP_DEV_PLAN")]
        plan: Option<String>,
        /// Start only the host cluster, Postgres and S3, without vcp and a tenant.
        #[arg(long, env = "VCP_DEV_NO_PLATFORM")]
        no_platform: bool,
        /// Run `vcp serve` as a local process against the dev cluster's Postgres instead of
        /// installing vcp with its Helm chart (quicker to iterate on vcp: no pods, one log in
        /// `<state-dir>/vcp/vcp-serve.log`). A state dir keeps the mode it was set up with.
        #[arg(long, env = "VCP_DEV_LOCAL", conflicts_with = "no_platform")]
        local: bool,
        /// Also start a real node: a kubelet, containerd and runc in namespaces of their own,
        /// running containers from images built here (docs/dev-cluster.md, "The real node").
        #[arg(long, env = "VCP_DEV_REAL_NODE", conflicts_with = "local")]
        real_node: bool,
    },
    /// Report each component (pid, port, healthy or not) and vcp's mode and API. Exits 1 if
    /// any is unhealthy.
    Status {
        #[arg(long, env = "VCP_DEV_STATE_DIR")]
        state_dir: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long, env = "VCP_DEV_JSON")]
        json: bool,
    },
    /// Stop everything `up` started (vcp's pods stop with the process node that runs them; the
    /// chart's release stays in the cluster's data for the next `up`). Safe to run twice.
    Down {
        #[arg(long, env = "VCP_DEV_STATE_DIR")]
        state_dir: PathBuf,
        /// Also delete the state dir (certificates, etcd and Postgres data, logs).
        #[arg(long, env = "VCP_DEV_PURGE")]
        purge: bool,
    },
    /// Write the control-plane images of every catalog minor and vcp's own images (from the
    /// workspace's build next to this binary) and import them into the real node of a dev
    /// cluster started with `up --real-node`. Prints one line per image.
    Images {
        #[arg(long, env = "VCP_DEV_STATE_DIR")]
        state_dir: PathBuf,
    },
    /// Benchmarks; each prints one summary line.
    #[command(subcommand)]
    Bench(Bench),
    /// The Kubernetes conformance suite against the host or a tenant of a dev cluster started
    /// with `up --real-node` (one summary line; `--compare` adds the parity). The suite is
    /// built on request: `VCP_KUBE_BIN_EXTRA=conformance tests/kube-bin/build.sh`.
    Conformance(conformance::Opts),
    /// Run the PV provisioner in the foreground (`up` starts it; not for direct use).
    #[command(hide = true)]
    Provisioner {
        #[arg(long, env = "VCP_DEV_STATE_DIR")]
        state_dir: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// Pods straight on the host versus through a tenant and its syncer (one summary line).
    Sync {
        /// Pods in each throughput phase.
        #[arg(long, env = "VCP_BENCH_PODS", default_value_t = 1000)]
        pods: usize,
        /// Creation rate of the latency phase, pods per second.
        #[arg(long, env = "VCP_BENCH_RATE", default_value_t = 50)]
        rate: u32,
        /// Pods in the latency phase.
        #[arg(long, env = "VCP_BENCH_LATENCY_PODS", default_value_t = 500)]
        latency_pods: usize,
        /// Concurrent creates in the throughput phases.
        #[arg(long, env = "VCP_BENCH_CONCURRENCY", default_value_t = 32)]
        concurrency: usize,
        /// Mount service-account tokens in the tenant pods (one TokenRequest and Secret each).
        #[arg(long, env = "VCP_BENCH_TOKENS")]
        tokens: bool,
        /// The `vcp-syncer` to measure (e.g. target/release/vcp-syncer); the workspace's
        /// debug build by default.
        #[arg(long, env = "VCP_BENCH_SYNCER")]
        syncer: Option<std::path::PathBuf>,
        /// Fail if the syncer's CPU over the host apiserver's (synced phase) exceeds this.
        #[arg(long, env = "VCP_BENCH_MAX_SYNCER_SHARE", value_parser = limit)]
        max_syncer_share: Option<f64>,
        /// Fail if the syncer's memory grows by more KiB per pod than this.
        #[arg(long, env = "VCP_BENCH_MAX_KIB_PER_POD", value_parser = limit)]
        max_kib_per_pod: Option<f64>,
        /// Fail if the syncer writes to the tenant apiserver more often per pod than this.
        #[arg(long, env = "VCP_BENCH_MAX_TENANT_WRITES_PER_POD", value_parser = limit)]
        max_tenant_writes_per_pod: Option<f64>,
        /// Fail if the syncer writes to the host apiserver more often per pod than this.
        #[arg(long, env = "VCP_BENCH_MAX_HOST_WRITES_PER_POD", value_parser = limit)]
        max_host_writes_per_pod: Option<f64>,
    },
    /// The kubelet API (logs, exec) through a tenant's syncer against the host pod directly
    /// (one summary line, ratios tenant over host).
    Kubelet {
        /// Size of the container log read whole, in MiB.
        #[arg(long, env = "VCP_BENCH_LOG_MIB", default_value_t = 64)]
        log_mib: usize,
        /// `kubectl exec` round trips per side.
        #[arg(long, env = "VCP_BENCH_EXECS", default_value_t = 50)]
        execs: usize,
    },
    /// What the revocation webhook costs a tenant API request: a revocable kubeconfig against
    /// a break-glass one (one summary line).
    Authz {
        /// GETs per kubeconfig and pass (three counted passes).
        #[arg(long, env = "VCP_BENCH_REQUESTS", default_value_t = 300)]
        requests: usize,
    },
    /// Tenants created at once through `vcp serve`: time to Ready, vcp's RSS and CPU.
    Provision {
        /// Tenants to create.
        #[arg(long, env = "VCP_BENCH_TENANTS", default_value_t = 5)]
        tenants: usize,
        /// Control planes on kwok nodes, Ready pods counting as serving (vcp's own overhead).
        #[arg(long, env = "VCP_BENCH_SIMULATE")]
        simulate: bool,
        /// Reconcile workers of vcp serve.
        #[arg(long, env = "VCP_BENCH_WORKERS", default_value_t = 8)]
        workers: u16,
        /// Seconds to watch vcp idle once every tenant is Ready.
        #[arg(long, env = "VCP_BENCH_IDLE_SECONDS", default_value_t = 60)]
        idle_seconds: u64,
    },
    /// Tenants on 1.36 moved to 1.37 by one fleet upgrade through `vcp serve`: wall time,
    /// per-tenant time, failures, vcp's RSS and CPU.
    Upgrade {
        /// Tenants to create and upgrade.
        #[arg(long, env = "VCP_BENCH_TENANTS", default_value_t = 3)]
        tenants: usize,
        /// Control planes on kwok nodes, Ready pods counting as serving (vcp's own overhead).
        #[arg(long, env = "VCP_BENCH_SIMULATE")]
        simulate: bool,
        /// Reconcile workers of vcp serve.
        #[arg(long, env = "VCP_BENCH_WORKERS", default_value_t = 8)]
        workers: u16,
        /// Tenants upgrading at once.
        #[arg(long, env = "VCP_BENCH_MAX_PARALLEL", default_value_t = 50)]
        max_parallel: u32,
        /// Fail if more tenants than this failed (or never finished).
        #[arg(long, env = "VCP_BENCH_MAX_FAILED", value_parser = limit)]
        max_failed: Option<f64>,
        /// Fail if vcp's CPU over the host apiserver's, while the fleet moved, exceeds this.
        #[arg(long, env = "VCP_BENCH_MAX_VCP_SHARE", value_parser = limit)]
        max_vcp_share: Option<f64>,
    },
    /// Idle tenants created one after the other on the real node of a running dev cluster
    /// (`up --real-node`) until one fails, `--tenants` is reached or the node runs short of
    /// memory: the kubelet's working set per tenant and per component, idle CPU, tenants per
    /// GiB and the last create's time (one summary line). Deletes them after unless `--keep`.
    Density(density::DensityBench),
    /// What the gateway adds to a tenant `get`, side by side with a direct NodePort to the same
    /// apiserver, over a kept connection and a new one per request (one summary line). Needs
    /// `up --real-node` (chart mode: tenants behind the gateway).
    Gateway(gateway_bench::GatewayBench),
    /// A tenant with many objects backed up to the dev cluster's S3 server and restored from
    /// it: end-to-end times, each Job container's, MiB/s (one summary line).
    Backup(backup_bench::BackupBench),
    /// Start and stop fresh clusters (new state dir each time) and report startup times.
    Startup {
        /// How many clusters to start, one after the other.
        #[arg(long, env = "VCP_BENCH_RUNS", default_value_t = 5)]
        runs: u32,
        /// Simulated worker nodes per cluster.
        #[arg(long, env = "VCP_DEV_WORKERS", default_value_t = 3)]
        workers: u32,
        /// Also start the real node, and report its part: its start images imported and a
        /// first pod Running on it.
        #[arg(long, env = "VCP_DEV_REAL_NODE")]
        real_node: bool,
    },
}

/// A benchmark limit: a finite number, zero or more (a NaN would never be exceeded).
fn limit(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!(
            "{s:?} is not a limit (a finite number, zero or more)"
        )),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // kube-client logs every failed request at ERROR, including expected refusals while
        // health probes wait for a component to listen; the caller reports real failures.
        .unwrap_or_else(|_| "warn,vcp_dev=info,kube_client::client::builder=off".into());
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if args.log_json {
        fmt.json().init();
    } else {
        fmt.init();
    }
    let runtime = tokio::runtime::Runtime::new().expect("failed to start the tokio runtime");
    match runtime.block_on(run(args.command)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", chain(&e));
            ExitCode::FAILURE
        }
    }
}

fn chain(e: &anyhow::Error) -> String {
    e.chain()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(": ")
}

async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Up {
            state_dir,
            workers,
            foreground,
            tenant,
            plan,
            no_platform,
            local,
            real_node,
        } => {
            let mode = if local {
                vcp_dev::platform::Mode::Local
            } else {
                vcp_dev::platform::Mode::Chart
            };
            // Before anything starts, so a platform that cannot come up leaves nothing running.
            if !no_platform {
                vcp_dev::platform::preflight(&state_dir, mode)?;
            }
            let supervision = if foreground {
                Supervision::Attached
            } else {
                Supervision::Detached
            };
            let c = cluster::DevCluster::start_with(Options {
                state_dir,
                workers,
                supervision,
                real_node,
            })
            .await?;
            let t = c.timings();
            let s = c.state();
            println!(
                "vcp-dev: host cluster {} is up in {}",
                s.kubernetes_version,
                c.state_dir().display()
            );
            println!(
                "  apiserver ready    {:>6.2}s  {}",
                t.apiserver_ready.as_secs_f64(),
                s.apiserver_url
            );
            println!(
                "  nodes Ready        {:>6.2}s  ({} kwok workers + devnode{})",
                t.nodes_ready.as_secs_f64(),
                s.workers,
                if real_node { " + real node" } else { "" }
            );
            println!("  everything up      {:>6.2}s", t.total.as_secs_f64());
            println!("  kubeconfig         {}", s.kubeconfig.display());
            println!("  postgres           {}", s.database_url);
            let platform = if no_platform {
                println!(
                    "use it:  source {}/env && kubectl get nodes",
                    c.state_dir().display()
                );
                None
            } else {
                let start = std::time::Instant::now();
                let p = if mode == vcp_dev::platform::Mode::Local {
                    println!(
                        "vcp-dev: starting vcp serve (local process) and tenant {tenant:?} ..."
                    );
                    vcp_dev::platform::up_local(&c, &tenant, plan.as_deref(), supervision).await?
                } else {
                    println!(
                        "vcp-dev: installing vcp with charts/vcp (helm release {} in namespace {}) \
                         and tenant {tenant:?} ...",
                        vcp_dev::chart::RELEASE,
                        vcp_dev::chart::NAMESPACE
                    );
                    vcp_dev::platform::up_chart(&c, &tenant, plan.as_deref()).await?
                };
                println!(
                    "  tenant {tenant} Ready   {:>6.2}s  {} (key {})",
                    start.elapsed().as_secs_f64(),
                    p.tenant["endpoint"].as_str().unwrap_or_default(),
                    p.tenant["key"].as_str().unwrap_or_default()
                );
                match p.mode {
                    vcp_dev::platform::Mode::Chart => println!(
                        "  vcp API            {}  (chart: NodePort of service {}/{})",
                        p.api_url,
                        vcp_dev::chart::NAMESPACE,
                        vcp_dev::chart::fullname(vcp_dev::chart::RELEASE)
                    ),
                    vcp_dev::platform::Mode::Local => {
                        println!("  vcp API            {}  (local vcp serve)", p.api_url)
                    }
                }
                println!("  tenant kubeconfig  {}", p.kubeconfig.display());
                println!(
                    "use it:  source {}/env   (VCP_API_URL, VCP_TOKEN, KUBECONFIG; vcp, kubectl, helm on PATH)",
                    c.state_dir().display()
                );
                println!("         vcp tenant list");
                println!(
                    "         kubectl --kubeconfig {} get ns",
                    p.kubeconfig.display()
                );
                Some(p)
            };
            if foreground {
                println!("running in the foreground; Ctrl-C or SIGTERM stops everything");
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = sigterm() => {}
                }
                drop(platform);
                drop(c);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Images { state_dir } => {
            let node_dir = state_dir.join(vcp_dev::node::DIR);
            let (layout, net) = vcp_dev::node::recorded(&node_dir).ok_or_else(|| {
                anyhow::anyhow!(
                    "{} has no real node: start it with `vcp-dev up --real-node`",
                    state_dir.display()
                )
            })?;
            let exe = std::env::current_exe()?;
            let bin_dir = exe.parent().ok_or_else(|| anyhow::anyhow!("no bin dir"))?;
            let (imgs, skipped) = vcp_dev::images::platform_images(bin_dir)?;
            for img in &imgs {
                vcp_dev::node::import(&layout, &net, std::slice::from_ref(img))?;
                println!("imported {}", img.reference);
            }
            for s in skipped {
                println!("skipped  {s} (its binaries are not built)");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Status { state_dir, json } => {
            let status = cluster::status(&state_dir).await?;
            let platform = vcp_dev::platform::status(&state_dir).await?;
            if json {
                let all = serde_json::json!({"components": status, "platform": platform});
                println!("{}", serde_json::to_string_pretty(&all)?);
            } else if status.is_empty() {
                println!("nothing is running in {}", state_dir.display());
            } else {
                println!("{:<24} {:>8} {:>6}  STATE", "COMPONENT", "PID", "PORT");
                for c in &status {
                    let port = c.port.map(|p| p.to_string()).unwrap_or_else(|| "-".into());
                    let state = match (c.running, c.healthy) {
                        (true, true) => "healthy",
                        (true, false) => "unhealthy",
                        _ => "stopped",
                    };
                    println!("{:<24} {:>8} {:>6}  {state}", c.name, c.pid, port);
                }
                match &platform {
                    Some(p) => {
                        let how = match (&p.record.release, &p.record.namespace) {
                            (Some(r), Some(ns)) => format!(" (helm release {r} in namespace {ns})"),
                            _ => String::new(),
                        };
                        let state = if p.healthy { "healthy" } else { "unhealthy" };
                        println!(
                            "vcp: {} mode{how}, API {} {state}, tenant {}",
                            p.record.mode, p.record.api_url, p.record.tenant
                        );
                    }
                    None => println!("vcp: not set up (up --no-platform)"),
                }
            }
            let ok = !status.is_empty()
                && status.iter().all(|c| c.healthy)
                && platform.as_ref().is_none_or(|p| p.healthy);
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Down { state_dir, purge } => {
            let n = cluster::down(&state_dir)?;
            println!("vcp-dev: stopped {n} components in {}", state_dir.display());
            if purge && state_dir.exists() {
                std::fs::remove_dir_all(&state_dir)?;
                println!("vcp-dev: removed {}", state_dir.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(Bench::Sync {
            pods,
            rate,
            latency_pods,
            concurrency,
            tokens,
            syncer,
            max_syncer_share,
            max_kib_per_pod,
            max_tenant_writes_per_pod,
            max_host_writes_per_pod,
        }) => {
            bench::sync(bench::SyncBench {
                limits: bench::SyncLimits {
                    syncer_share: max_syncer_share,
                    kib_per_pod: max_kib_per_pod,
                    tenant_writes_per_pod: max_tenant_writes_per_pod,
                    host_writes_per_pod: max_host_writes_per_pod,
                },
                pods,
                rate,
                latency_pods,
                concurrency,
                tokens,
                syncer,
            })
            .await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(Bench::Density(b)) => {
            density::run(b).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(Bench::Gateway(b)) => {
            gateway_bench::run(b).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(Bench::Backup(b)) => {
            backup_bench::run(b).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(Bench::Authz { requests }) => {
            bench::authz(bench::AuthzBench { requests }).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(Bench::Kubelet { log_mib, execs }) => {
            bench::kubelet(bench::KubeletBench { log_mib, execs }).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(Bench::Provision {
            tenants,
            simulate,
            workers,
            idle_seconds,
        }) => {
            bench::provision(bench::ProvisionBench {
                tenants,
                simulate,
                workers,
                idle_seconds,
            })
            .await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(Bench::Upgrade {
            tenants,
            simulate,
            workers,
            max_parallel,
            max_failed,
            max_vcp_share,
        }) => {
            bench::upgrade(bench::UpgradeBench {
                tenants,
                simulate,
                workers,
                max_parallel,
                limits: bench::UpgradeLimits {
                    failed: max_failed,
                    vcp_share: max_vcp_share,
                },
            })
            .await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(Bench::Startup {
            runs,
            workers,
            real_node,
        }) => {
            let mut samples = Vec::new();
            let mut first_pods = Vec::new();
            for run in 1..=runs.max(1) {
                let dir = tempfile::Builder::new().prefix("vcp-bench-").tempdir()?;
                let c = cluster::DevCluster::start_with(Options {
                    state_dir: dir.path().to_owned(),
                    workers,
                    supervision: Supervision::Attached,
                    real_node,
                })
                .await?;
                let t = c.timings();
                if real_node {
                    let first = bench::first_pod_on_real_node(&c).await?;
                    println!(
                        "run {run}: node_images_s={:.2} first_pod_running_s={:.2}",
                        t.node_images.unwrap_or_default().as_secs_f64(),
                        first.as_secs_f64()
                    );
                    first_pods.push((
                        t.node_images.unwrap_or_default().as_secs_f64(),
                        first.as_secs_f64(),
                    ));
                }
                drop(c);
                println!(
                    "run {run}: apiserver_ready_s={:.2} nodes_ready_s={:.2} total_s={:.2}",
                    t.apiserver_ready.as_secs_f64(),
                    t.nodes_ready.as_secs_f64(),
                    t.total.as_secs_f64()
                );
                samples.push(t);
            }
            let stat = |f: fn(&vcp_dev::Timings) -> f64| {
                let mut v: Vec<f64> = samples.iter().map(f).collect();
                v.sort_by(f64::total_cmp);
                (v[v.len() / 2], v[v.len() - 1])
            };
            let (api50, apimax) = stat(|t| t.apiserver_ready.as_secs_f64());
            let (nodes50, nodesmax) = stat(|t| t.nodes_ready.as_secs_f64());
            let (total50, totalmax) = stat(|t| t.total.as_secs_f64());
            let node = if first_pods.is_empty() {
                String::new()
            } else {
                let p50 = |mut v: Vec<f64>| {
                    v.sort_by(f64::total_cmp);
                    v[v.len() / 2]
                };
                format!(
                    " real_node=1 node_images_p50_s={:.2} first_pod_running_p50_s={:.2}",
                    p50(first_pods.iter().map(|x| x.0).collect()),
                    p50(first_pods.iter().map(|x| x.1).collect())
                )
            };
            println!(
                "bench-startup runs={} workers={workers} apiserver_ready_p50_s={api50:.2} \
                 apiserver_ready_max_s={apimax:.2} nodes_ready_p50_s={nodes50:.2} \
                 nodes_ready_max_s={nodesmax:.2} total_p50_s={total50:.2} total_max_s={totalmax:.2}{node}",
                samples.len()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Conformance(o) => conformance::run(o).await,
        Command::Provisioner { state_dir } => {
            let client = cluster::client_from(&state_dir.join("host.kubeconfig")).await?;
            let volumes = state_dir.join("volumes");
            tokio::select! {
                () = vcp_dev::provisioner::run(client, volumes) => {}
                _ = tokio::signal::ctrl_c() => {}
                _ = sigterm() => {}
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn sigterm() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut s) => {
            s.recv().await;
        }
        Err(_) => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_bench_limit_is_a_finite_number_of_zero_or_more() {
        assert_eq!(super::limit("0.5"), Ok(0.5));
        for bad in ["nan", "inf", "-1", "lots", ""] {
            assert!(super::limit(bad).is_err(), "{bad}");
        }
    }
}
