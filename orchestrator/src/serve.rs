//! `vcp serve`: migrations, the admin token, reconcile workers, the fleet upgrade worker, the
//! patch update sweep, the usage sampler and the HTTP API in one process.

use crate::host::{Config, Provisioner, TenantAccess};
use crate::http::AppState;
use crate::http::auth::{new_token, token_hash};
use crate::inventory::{Inventory, Released};
use crate::metrics::{Metrics, PassKind};
use crate::provision::wake::Woken;
use crate::render::catalog::Catalog;
use crate::render::{Expose, Renderer, Settings};
use crate::{Error, Result, api, render};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use vcp_core::lifecycle::{Desired, Phase};

/// Database flags.
#[derive(Debug, Clone, clap::Args)]
pub struct DatabaseArgs {
    /// Postgres URL of the inventory.
    #[arg(long, env = "VCP_DATABASE_URL")]
    pub database_url: String,
}

/// How tenant apiservers are exposed (flag form of [`Expose`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExposeKind {
    NodePort,
    LoadBalancer,
    Hostname,
    Gateway,
}

/// Flags of `vcp serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    /// Kubeconfig of the host cluster; in-cluster configuration if absent.
    #[arg(long, env = "VCP_HOST_KUBECONFIG")]
    pub host_kubeconfig: Option<PathBuf>,
    /// Directory with the component templates (and optionally versions.yaml) to use instead
    /// of the built-in ones.
    #[arg(long, env = "VCP_TEMPLATES")]
    pub templates: Option<PathBuf>,
    /// YAML file of named placement plans (name -> plan); `default` exists regardless.
    #[arg(long, env = "VCP_PLANS")]
    pub plans: Option<PathBuf>,
    /// YAML file of the shared datastores vcp runs (name -> datastore: members, placement,
    /// storage); a plan's `datastore: NAME` puts its tenants' data on one
    /// (docs/orchestrator.md, "Shared datastores").
    #[arg(long, env = "VCP_DATASTORES")]
    pub datastores: Option<PathBuf>,
    /// Prefix of the shared host ClusterRoles vcp and the syncers bind per namespace
    /// (`<prefix>:tenant-namespace`, `<prefix>:syncer-namespaced`; templates/host-roles.yaml):
    /// the chart sets its release's full name, so two releases in one cluster do not share them.
    #[arg(long, env = "VCP_HOST_ROLES_PREFIX", default_value = "vcp")]
    pub host_roles_prefix: String,
    /// Address of the HTTP API.
    #[arg(long, env = "VCP_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Seconds this replica goes on serving after SIGTERM, with `/readyz` answering 503, before
    /// it stops accepting connections: load balancers and kube-proxy take a moment to stop
    /// sending new ones to a stopping pod, and a connection sent meanwhile must not be refused.
    #[arg(long, env = "VCP_DRAIN_SECONDS", default_value_t = 5,
          value_parser = clap::value_parser!(u64).range(0..=300))]
    pub drain_seconds: u64,
    /// Seconds a connection may wait for a request without receiving a byte of it (a new
    /// connection, or a kept-alive one after its last answer) before it is closed.
    #[arg(long, env = "VCP_HTTP_IDLE_TIMEOUT_SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub http_idle_timeout_seconds: u64,
    /// Seconds from the first byte of a request head to its end.
    #[arg(long, env = "VCP_HTTP_HEADER_TIMEOUT_SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub http_header_timeout_seconds: u64,
    /// Seconds from the end of a request head to the end of its body (408 after).
    #[arg(long, env = "VCP_HTTP_BODY_TIMEOUT_SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub http_body_timeout_seconds: u64,
    /// API connections open at once; past it, new clients wait to be accepted.
    #[arg(long, env = "VCP_HTTP_MAX_CONNECTIONS", default_value_t = 1024,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub http_max_connections: u64,
    /// The host cluster's service CIDR (tenant apiservers allocate from the same range).
    #[arg(long, env = "VCP_SERVICE_CIDR", default_value = "10.96.0.0/12")]
    pub service_cidr: String,
    /// Cluster domain inside tenants.
    #[arg(long, env = "VCP_CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Image of the per-tenant syncer.
    #[arg(long, env = "VCP_SYNCER_IMAGE", default_value = concat!("ghcr.io/vcp-dev/vcp-syncer:", env!("CARGO_PKG_VERSION")))]
    pub syncer_image: String,
    /// Image with the `vcp` binary, run by the etcd snapshot and restore Jobs.
    #[arg(long, env = "VCP_TOOLS_IMAGE", default_value = concat!("ghcr.io/vcp-dev/vcp:", env!("CARGO_PKG_VERSION")))]
    pub tools_image: String,
    /// How tenant apiservers are exposed.
    #[arg(long, env = "VCP_EXPOSE", value_enum, default_value = "node-port")]
    pub expose: ExposeKind,
    /// Address kubeconfigs use with `--expose node-port` (a node address or a name for them);
    /// with `--expose gateway`, optional: the gateway's address, dialled with the tenant's
    /// name as `tls-server-name` (where no wildcard DNS names the gateway).
    #[arg(long, env = "VCP_EXPOSE_ADDRESS")]
    pub expose_address: Option<String>,
    /// Domain with `--expose hostname` or `gateway`: tenants are `https://<key>.<domain>`.
    #[arg(long, env = "VCP_EXPOSE_DOMAIN")]
    pub expose_domain: Option<String>,
    /// Port of the gateway with `--expose gateway` (what kubeconfigs dial).
    #[arg(long, env = "VCP_EXPOSE_PORT", default_value_t = 443, value_parser = clap::value_parser!(u16).range(1..))]
    pub expose_port: u16,
    /// How vcp reaches tenant apiservers.
    #[arg(long, env = "VCP_TENANT_ACCESS", value_enum, default_value = "service")]
    pub tenant_access: TenantAccess,
    /// Concurrent reconcile workers.
    #[arg(long, env = "VCP_WORKERS", default_value_t = 4)]
    pub workers: u16,
    /// Name of this replica in leases and the audit trail.
    #[arg(long, env = "VCP_REPLICA_ID")]
    pub replica_id: Option<String>,
    /// Admin bearer token to accept (stored hashed). Without it, the first start generates one
    /// and prints it once.
    #[arg(long, env = "VCP_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// The inventory key: base64 of 32 random bytes (`head -c 32 /dev/urandom | base64`).
    /// Each tenant's etcd encryption keys are kept in the inventory sealed with it; every
    /// replica needs the same one, and the inventory's keys (and the backups they encrypt) are
    /// unreadable without it. Required.
    #[arg(long, env = "VCP_INVENTORY_KEY", hide_env_values = true)]
    pub inventory_key: Option<String>,
    /// The gateway's bearer token (stored hashed): it may report which tenants had
    /// connections and wake asleep ones (`/v1/gateway/...`), nothing else.
    #[arg(long, env = "VCP_GATEWAY_TOKEN", hide_env_values = true)]
    pub gateway_token: Option<String>,
    /// Seconds between idle sweeps, which put tenants to sleep whose plan's
    /// `sleep.after_idle_minutes` has passed without a connection or a running pod (5-3600).
    #[arg(long, env = "VCP_SLEEP_SWEEP_SECONDS", default_value_t = 60,
        value_parser = clap::value_parser!(u64).range(5..=3600))]
    pub sleep_sweep_seconds: u64,
    /// Benchmarks only: treat a tenant's control plane as up when its pods are Ready, without
    /// talking to its apiserver (for control-plane pods placed on simulated kwok nodes).
    #[arg(long, env = "VCP_SIMULATE_CONTROL_PLANES")]
    pub simulate_control_planes: bool,
    /// Longest kubeconfig lifetime the API issues, in hours; a week by default (expiry ends a
    /// credential when everything else failed, and bounds the revocation list). At most a
    /// year: a kubeconfig must expire well before the tenant CA that signs it.
    #[arg(long, env = "VCP_MAX_KUBECONFIG_TTL_HOURS", default_value_t = 168,
          value_parser = clap::value_parser!(u64).range(1..=8760))]
    pub max_kubeconfig_ttl_hours: u64,
    /// How often each Ready tenant's quota usage is sampled from the host into the inventory,
    /// in seconds (10 to 86400). Each sample costs four list requests to the host apiserver
    /// per tenant; replicas share the work.
    #[arg(long, env = "VCP_USAGE_INTERVAL_SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(10..=86_400))]
    pub usage_interval_seconds: u64,
    /// How long usage samples are kept, in days (1 to 36500); older ones are pruned, deleted
    /// tenants' samples included.
    #[arg(long, env = "VCP_USAGE_RETENTION_DAYS", default_value_t = 90,
          value_parser = clap::value_parser!(u64).range(1..=36_500))]
    pub usage_retention_days: u64,
    /// How long one hop of an upgrade may take, in seconds, before it is rolled back (30 to
    /// 3600).
    #[arg(long, env = "VCP_UPGRADE_HOP_TIMEOUT_SECONDS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(30..=3600))]
    pub upgrade_hop_timeout_seconds: u64,
    /// How often each replica looks for tenants to move to a newer patch release
    /// (`auto_update: patch`, in their maintenance window), in seconds (5 to 3600).
    #[arg(long, env = "VCP_AUTO_UPDATE_INTERVAL_SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(5..=3600))]
    pub auto_update_interval_seconds: u64,
    /// Address of the audit ingest, a listener of its own where tenant apiservers post their
    /// audit events (only that route is served there). Required with --audit-url.
    #[arg(long, env = "VCP_AUDIT_LISTEN")]
    pub audit_listen: Option<String>,
    /// The URL tenant apiservers post their audit events to: this ingest as the control-plane
    /// pods reach it, e.g. `http://vcp.vcp-system.svc:8081/audit/v1/events`. Absent: tenant
    /// apiservers keep no audit log.
    #[arg(long, env = "VCP_AUDIT_URL")]
    pub audit_url: Option<String>,
    /// How often each replica deletes tenant audit events older than their plan keeps them,
    /// in seconds (1 to 86400).
    #[arg(long, env = "VCP_TENANT_AUDIT_SWEEP_SECONDS", default_value_t = 3600,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub tenant_audit_sweep_seconds: u64,
    /// Where snapshots go off the host: a YAML file with the S3-compatible store's `endpoint`,
    /// `bucket`, `prefix` and `region` (docs/orchestrator.md, "Backups"). Each snapshot is
    /// sealed with its tenant's backup key and uploaded there by its Job; restores read it
    /// back. Absent: snapshots stay on the tenant's claim only.
    #[arg(long, env = "VCP_BACKUP_STORE", requires_all = ["backup_access_key_id", "backup_secret_access_key"])]
    pub backup_store: Option<PathBuf>,
    /// The backup store's access key id (the chart takes it from a Secret).
    #[arg(long, env = "VCP_BACKUP_ACCESS_KEY_ID", hide_env_values = true)]
    pub backup_access_key_id: Option<String>,
    /// The backup store's secret access key (the chart takes it from a Secret).
    #[arg(long, env = "VCP_BACKUP_SECRET_ACCESS_KEY", hide_env_values = true)]
    pub backup_secret_access_key: Option<String>,
    /// Seconds between backup sweeps, which ask for the snapshots plans schedule
    /// (`backups: {hourly, daily}`) and delete those retention drops (2 to 3600).
    #[arg(long, env = "VCP_BACKUP_SWEEP_SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(2..=3600))]
    pub backup_sweep_seconds: u64,
}

/// How long a claimed tenant stays ours without renewal.
pub const LEASE: Duration = Duration::from_secs(60);

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })
}

/// Builds the provisioning configuration from flags.
pub fn config(a: &ServeArgs) -> Result<Config> {
    let (renderer, catalog) = match &a.templates {
        Some(dir) => {
            let versions = dir.join("versions.yaml");
            let catalog = if versions.exists() {
                Catalog::parse(&read(&versions)?)?
            } else {
                Catalog::builtin()
            };
            (Renderer::from_dir(dir)?, catalog)
        }
        None => (Renderer::builtin()?, Catalog::builtin()),
    };
    let plans = match &a.plans {
        Some(p) => render::parse_plans(&read(p)?)?,
        None => render::parse_plans("{}")?,
    };
    let datastores = match &a.datastores {
        Some(p) => render::datastore::parse_datastores(&read(p)?)?,
        None => Default::default(),
    };
    render::check_datastores(&plans, &datastores)?;
    let expose =
        match a.expose {
            ExposeKind::NodePort => Expose::NodePort {
                address: a.expose_address.clone().ok_or_else(|| {
                    Error::Config("--expose node-port needs --expose-address".into())
                })?,
            },
            ExposeKind::LoadBalancer => Expose::LoadBalancer,
            ExposeKind::Hostname => Expose::Hostname {
                domain: a.expose_domain.clone().ok_or_else(|| {
                    Error::Config("--expose hostname needs --expose-domain".into())
                })?,
            },
            ExposeKind::Gateway => Expose::Gateway {
                domain: a.expose_domain.clone().ok_or_else(|| {
                    Error::Config("--expose gateway needs --expose-domain".into())
                })?,
                port: a.expose_port,
                address: a.expose_address.clone(),
            },
        };
    if let Expose::Hostname { domain } | Expose::Gateway { domain, .. } = &expose
        && !crate::names::is_tenant_domain(domain)
    {
        return Err(Error::Config(format!(
            "--expose-domain {domain:?} is not a lowercase DNS name of at most 232 characters"
        )));
    }
    if !render::host_rbac::valid_prefix(&a.host_roles_prefix) {
        return Err(Error::Config(format!(
            "--host-roles-prefix {:?} is not a release name (lowercase letters, digits, '-', '.')",
            a.host_roles_prefix
        )));
    }
    if crate::host::first_service_ip(&a.service_cidr).is_none() {
        return Err(Error::Config(format!(
            "--service-cidr {:?} is not a CIDR",
            a.service_cidr
        )));
    }
    // No default, not even for development: a replica with another key (or none) could not
    // open the keys the others made, and tenants' Secrets must never go to etcd unencrypted
    // because a flag was forgotten.
    let inventory_key = a.inventory_key.as_deref().ok_or_else(|| {
        Error::Config(
            "vcp serve needs --inventory-key (VCP_INVENTORY_KEY), the base64 of 32 random bytes \
             (`head -c 32 /dev/urandom | base64`), the same for every replica: it seals the \
             tenants' etcd encryption keys in the inventory"
                .into(),
        )
    })?;
    let inventory_key = crate::pki::seal::InventoryKey::from_base64(inventory_key)?;
    if let Some(url) = &a.audit_url {
        if crate::render::audit::authority(url).is_none() {
            return Err(Error::Config(format!(
                "--audit-url {url:?} is not an http or https URL with a host"
            )));
        }
        if a.audit_listen.is_none() {
            return Err(Error::Config(
                "--audit-url needs --audit-listen: the ingest the URL names must be served".into(),
            ));
        }
    }
    let backups = match &a.backup_store {
        None => None,
        Some(p) => Some(crate::snapshots::offsite::BackupStore {
            config: crate::snapshots::offsite::StoreConfig::parse(&read(p)?)?,
            credentials: crate::snapshots::offsite::Credentials {
                access_key_id: a.backup_access_key_id.clone().unwrap_or_default(),
                secret_access_key: a.backup_secret_access_key.clone().unwrap_or_default(),
            },
        }),
    };
    Ok(Config {
        catalog,
        plans,
        settings: Settings {
            service_cidr: a.service_cidr.clone(),
            cluster_domain: a.cluster_domain.clone(),
            syncer_image: a.syncer_image.clone(),
            tools_image: a.tools_image.clone(),
            expose,
            host_roles_prefix: a.host_roles_prefix.clone(),
            datastores,
            audit_url: a.audit_url.clone(),
        },
        renderer,
        access: a.tenant_access,
        simulate: a.simulate_control_planes,
        hop_timeout: Duration::from_secs(a.upgrade_hop_timeout_seconds),
        // Asked of the host once it is connected (serve).
        host_user: String::new(),
        inventory_key,
        backups,
    })
}

async fn host_client(a: &ServeArgs) -> Result<kube::Client> {
    match &a.host_kubeconfig {
        Some(p) => crate::host::client_from_kubeconfig(&read(p)?).await,
        None => kube::Client::try_default()
            .await
            .map_err(|e| Error::kube("load the in-cluster configuration", e)),
    }
}

/// Runs until SIGTERM or SIGINT.
pub async fn serve(a: ServeArgs) -> Result<()> {
    let mut config = config(&a)?;
    let inv = Inventory::connect(&a.db.database_url).await?;
    inv.migrate().await?;
    inv.upsert_versions(&config.catalog).await?;
    // Who changes the admin token, in the audit trail: this vcp, at its start.
    let actor = format!(
        "vcp:{}",
        a.replica_id.clone().unwrap_or_else(|| "serve".into())
    );
    match &a.admin_token {
        Some(t) => {
            let change = inv
                .ensure_admin_token("admin", &token_hash(t), &actor)
                .await?;
            if change == crate::tokens::store::AdminTokenChange::StillRevoked {
                tracing::warn!(
                    "the configured admin token was revoked and stays revoked; configure another to replace it"
                );
            }
        }
        None if inv.admin_tokens().await? == 0 => {
            let t = new_token();
            inv.ensure_admin_token("admin", &token_hash(&t), &actor)
                .await?;
            // Shown once, on stdout (not in logs): only its hash is kept.
            println!("vcp: admin token (shown once, store it now): {t}");
        }
        None => {}
    }
    if let Some(t) = &a.gateway_token {
        if t.trim().len() < 16 {
            return Err(Error::Config(
                "--gateway-token must be at least 16 characters".into(),
            ));
        }
        inv.ensure_gateway_token(&token_hash(t.trim()), &actor)
            .await?;
    }
    // Every key in the inventory must open with this replica's inventory key.
    let kek = config.inventory_key.id().to_owned();
    let others: Vec<String> = inv
        .encryption_kek_ids()
        .await?
        .into_iter()
        .filter(|id| *id != kek)
        .collect();
    if !others.is_empty() {
        return Err(Error::Config(format!(
            "the inventory holds tenant encryption keys sealed with inventory key {} and this \
             replica has inventory key {kek}: start it with the --inventory-key the others use",
            others.join(", ")
        )));
    }
    tracing::info!(inventory_key = %kek, "tenants' encryption keys are sealed with this inventory key");
    let host = host_client(&a).await?;
    config.host_user = crate::host::ssa::identity(&host).await?;
    crate::host::ssa::ensure_host_roles(&host, &config.settings.host_roles_prefix).await?;
    let config = Arc::new(config);
    let replica = a
        .replica_id
        .clone()
        .unwrap_or_else(|| format!("vcp-{}", std::process::id()));
    let released = inv.release_leases_of(&replica).await?;
    if released != Released::default() {
        tracing::info!(
            replica,
            tenants = released.tenants,
            fleet_upgrades = released.fleet_upgrades,
            "took back leases of this replica's previous run"
        );
    }
    let prov = Provisioner {
        inventory: inv.clone(),
        host,
        config: config.clone(),
    };
    let metrics = Arc::new(Metrics::new());
    let wake = Arc::new(Notify::new());
    tokio::spawn(listen(inv.clone(), wake.clone()));
    // Readiness changes on the host wake their tenants (provision::wake) instead of a poll.
    let woken = Arc::new(Woken::default());
    tokio::spawn(crate::provision::wake::run(
        prov.host.clone(),
        inv.clone(),
        woken.clone(),
    ));
    for i in 0..a.workers {
        tokio::spawn(worker(
            prov.clone(),
            format!("{replica}/{i}"),
            wake.clone(),
            woken.clone(),
            metrics.clone(),
        ));
    }
    // One fleet worker per replica: stepping a fleet upgrade is a few queries, and the lease
    // lets any replica's worker take over one whose holder died.
    tokio::spawn(crate::upgrades::runner::run(
        inv.clone(),
        config.clone(),
        format!("{replica}/fleet"),
        wake.clone(),
        metrics.clone(),
    ));
    // One patch update sweep per replica: a start re-checks the tenant in one conditional
    // statement, so sweeps of several replicas never start one tenant twice.
    tokio::spawn(crate::upgrades::auto::run(
        inv.clone(),
        config.clone(),
        format!("{replica}/auto-update"),
        Duration::from_secs(a.auto_update_interval_seconds),
        metrics.clone(),
    ));
    tokio::spawn(
        crate::usage::Sampler::new(inv.clone(), prov.host.clone(), &config.plans).run(
            Duration::from_secs(a.usage_interval_seconds),
            Duration::from_secs(a.usage_retention_days * 86_400),
            metrics.clone(),
        ),
    );
    // Shared datastores: their members, PKI and root user (idempotent on every replica).
    tokio::spawn(crate::datastore::host::run(prov.clone()));
    // One backup sweep per replica: a scheduled snapshot is asked for under the tenant's row
    // lock, and pruning twice deletes an object that is gone already (snapshots/schedule.rs).
    let store = match &config.backups {
        Some(b) => Some(crate::snapshots::offsite::Store::open(b)?),
        None => None,
    };
    tokio::spawn(crate::snapshots::schedule::run(
        inv.clone(),
        config.clone(),
        store,
        format!("vcp:{replica}"),
        Duration::from_secs(a.backup_sweep_seconds),
    ));
    // One idle sweep per replica: a sleep re-checks the tenant under its row lock.
    tokio::spawn(crate::sleep::sweep::run(
        inv.clone(),
        prov.host.clone(),
        config.clone(),
        Duration::from_secs(a.sleep_sweep_seconds),
    ));
    // Tenant audit logs: every replica sweeps (bounded deletes; see tenant_audit::retention)
    // and serves the ingest on a listener of its own.
    tokio::spawn(crate::tenant_audit::retention::run(
        inv.clone(),
        config.plans.clone(),
        Duration::from_secs(a.tenant_audit_sweep_seconds),
    ));
    if let Some(addr) = &a.audit_listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(Error::Serve)?;
        tracing::info!(listen = %listener.local_addr().map_err(Error::Serve)?, url = ?a.audit_url, "tenant audit ingest serving");
        let limits = crate::http::conn::Limits {
            idle: Duration::from_secs(a.http_idle_timeout_seconds),
            header: Duration::from_secs(a.http_header_timeout_seconds),
            body: Duration::from_secs(a.http_body_timeout_seconds),
            max_connections: usize::try_from(a.http_max_connections).unwrap_or(usize::MAX),
            max_body: crate::tenant_audit::events::MAX_BODY,
        };
        let router = crate::tenant_audit::ingest::router(inv.clone());
        tokio::spawn(async move {
            // Stops with the process: the apiservers' webhooks retry what a stop interrupts.
            let forever = std::future::pending::<()>();
            if let Err(e) = crate::http::conn::serve(listener, router, limits, forever).await {
                tracing::error!(error = %e, "tenant audit ingest failed");
            }
        });
    }
    let draining = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let state = AppState {
        inventory: inv,
        provisioner: prov,
        metrics,
        max_kubeconfig_ttl: Duration::from_secs(a.max_kubeconfig_ttl_hours * 3600),
        draining: draining.clone(),
    };
    let listener = tokio::net::TcpListener::bind(&a.listen)
        .await
        .map_err(Error::Serve)?;
    tracing::info!(listen = %listener.local_addr().map_err(Error::Serve)?, replica, console = crate::console::PAGE, "vcp serving");
    let limits = crate::http::conn::Limits {
        idle: Duration::from_secs(a.http_idle_timeout_seconds),
        header: Duration::from_secs(a.http_header_timeout_seconds),
        body: Duration::from_secs(a.http_body_timeout_seconds),
        max_connections: usize::try_from(a.http_max_connections).unwrap_or(usize::MAX),
        max_body: crate::http::MAX_BODY,
    };
    let drain = Duration::from_secs(a.drain_seconds);
    crate::http::conn::serve(
        listener,
        api::router(state),
        limits,
        shutdown(draining, drain),
    )
    .await
    .map_err(Error::Serve)
}

/// Resolves `drain` after SIGTERM or SIGINT, having set `draining` (so `/readyz` answers 503)
/// at the signal; the server then stops accepting and finishes what it has.
async fn shutdown(draining: Arc<std::sync::atomic::AtomicBool>, drain: Duration) {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("signal handlers install");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    draining.store(true, std::sync::atomic::Ordering::Relaxed);
    tracing::info!(
        drain_seconds = drain.as_secs(),
        "stopping: draining before closing the listener"
    );
    tokio::time::sleep(drain).await;
}

/// Wakes workers on every `NOTIFY vcp_tenants`, reconnecting after database outages.
async fn listen(inv: Inventory, wake: Arc<Notify>) {
    loop {
        match inv.listener().await {
            Ok(mut l) => loop {
                match l.recv().await {
                    Ok(_) => wake.notify_waiters(),
                    Err(e) => {
                        tracing::warn!(error = %e, "inventory notifications interrupted");
                        break;
                    }
                }
            },
            Err(e) => tracing::warn!(error = %e.public(), "cannot listen for inventory changes"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Claims due tenants and runs passes over them, one at a time.
async fn worker(
    prov: Provisioner,
    id: String,
    wake: Arc<Notify>,
    woken: Arc<Woken>,
    metrics: Arc<Metrics>,
) {
    let actor = format!("reconciler/{id}");
    loop {
        // Register interest before looking, so a NOTIFY between the look and the wait is not lost.
        let notified = wake.notified();
        let claimed = match prov.inventory.claim(&id, LEASE).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(worker = %id, error = %e.public(), "claim failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let Some(t) = claimed else {
            let due = prov
                .inventory
                .next_due()
                .await
                .ok()
                .flatten()
                .unwrap_or(Duration::from_secs(5));
            let _ = tokio::time::timeout(
                due.clamp(Duration::from_millis(50), Duration::from_secs(5)),
                notified,
            )
            .await;
            continue;
        };
        let start = Instant::now();
        woken.begin(&t.key);
        let pass = prov.pass(&t, &actor, time::OffsetDateTime::now_utc()).await;
        let kind = match t.desired {
            Desired::Present => PassKind::BringUp,
            Desired::Absent => PassKind::TearDown,
        };
        metrics.pass(kind, start.elapsed(), pass.error);
        for (part, took) in &pass.work {
            metrics.bring_up_work(part, *took);
        }
        let work = pass
            .work
            .iter()
            .map(|(part, took)| format!("{part}={}ms", took.as_millis()))
            .collect::<Vec<_>>()
            .join(" ");
        let mut outcome = pass.outcome;
        if woken.end(&t.key) {
            // The host changed under the pass (a pod became ready): look again at once
            // rather than at the requeue the pass chose from what it saw before.
            outcome.requeue_after = Duration::ZERO;
        }
        tracing::info!(tenant = %t.name, key = %t.key, phase = %outcome.phase, error = pass.error, ms = start.elapsed().as_millis() as u64, work, "pass");
        let written = match outcome.phase {
            Phase::Deleted => prov.inventory.tombstone(&t, &id, &actor).await,
            _ => prov.inventory.finish(&t, &id, &outcome, &actor).await,
        };
        match written {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(tenant = %t.name, worker = %id, "lease lost; another worker owns the tenant now")
            }
            Err(e) => {
                tracing::warn!(tenant = %t.name, error = %e.public(), "cannot record the pass")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    #[test]
    fn the_kubeconfig_ttl_cap_stays_within_a_year() {
        let parse = |hours: &str| {
            crate::Args::try_parse_from([
                "vcp",
                "serve",
                "--database-url",
                "postgres://localhost/vcp",
                "--max-kubeconfig-ttl-hours",
                hours,
            ])
        };
        assert!(parse("720").is_ok());
        assert!(parse("8760").is_ok());
        for bad in ["0", "8761", "18446744073709551615", "-1"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn usage_sampling_and_retention_flags_are_bounded() {
        let parse = |flag: &str, v: &str| {
            crate::Args::try_parse_from([
                "vcp",
                "serve",
                "--database-url",
                "postgres://localhost/vcp",
                flag,
                v,
            ])
        };
        let serve = |a: crate::Args| match a.command {
            crate::Command::Serve(s) => *s,
            _ => unreachable!("parsed as serve"),
        };
        let d = serve(parse("--workers", "1").unwrap());
        assert_eq!((d.usage_interval_seconds, d.usage_retention_days), (60, 90));
        assert_eq!(
            serve(parse("--usage-interval-seconds", "10").unwrap()).usage_interval_seconds,
            10
        );
        for bad in ["0", "9", "86401", "x"] {
            assert!(parse("--usage-interval-seconds", bad).is_err(), "{bad}");
        }
        for bad in ["0", "36501", "-1"] {
            assert!(parse("--usage-retention-days", bad).is_err(), "{bad}");
        }
    }
}
