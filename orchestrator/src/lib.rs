//! vcp orchestrator: turns tenant requests into control planes on a host cluster.
//!
//! Data flow: the platform API ([`api`]) validates requests and writes desired tenants into the
//! Postgres inventory ([`inventory`], the only module with SQL). Reconcile workers
//! ([`provision`]) claim due tenants from the inventory (row leases, so replicas never double
//! up), render each tenant's control plane from templates ([`render`], pure) with certificates
//! from [`pki`] (pure), apply it to the host cluster step by step, gated on readiness, and
//! write phase and conditions back. A sampler ([`usage`]) counts each Ready tenant's host
//! objects against its plan's quota into the inventory, which the API serves for billing.
//! Nothing that matters lives only in memory: a replica killed at any line leaves state
//! another one resumes from.
//!
//! The tenant lifecycle (desired state, phase, conditions) is typed once, in [`vcp_core::lifecycle`]
//! (pure), and used by every layer. [`serve`] wires the workers, the sampler and the API
//! together; [`metrics`] and the logs (`vcp-telemetry`) are what an operator sees of them.
//!
//! Tenant keys, host names and the `vcp.dev` labels come from `vcp_core::naming`, and plan
//! policies, quota and usage rules from `vcp_policy`: the crates the syncer uses for the same
//! things, so both sides agree by construction (this crate does not depend on the syncer).

// Layers, bottom to top; a module uses only those above it in this list (docs/architecture.md).
// Pure: no pool, no client.
pub mod backup_store;
pub mod lifecycle;
pub mod metrics;
pub mod names;
pub mod pki;
pub mod render;
pub mod window;
// The tenants' table, and the writes every feature shares.
pub mod inventory;
// What every feature shares: the host handle, the HTTP plumbing, the client's.
pub mod client;
pub mod host;
pub mod http;
// The features, one folder each: API handlers and bodies, queries, host work, CLI command.
pub mod audit;
pub mod clones;
pub mod console;
pub mod datastore;
pub mod encryption;
pub mod etcd;
pub mod kubeconfigs;
pub mod members;
pub mod rotations;
pub mod sleep;
pub mod snapshots;
pub mod tenant_audit;
pub mod tenants;
pub mod tokens;
pub mod upgrades;
pub mod usage;
// What puts the features together: the reconcile pass, the router, the command line, serve.
pub mod api;
pub mod cli;
pub mod provision;
pub mod serve;

use clap::{Parser, Subcommand};

/// Errors of the orchestrator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("database request failed")]
    Database(#[source] sqlx::Error),
    #[error("database migration failed")]
    Migrate(#[source] sqlx::migrate::MigrateError),
    #[error("failed to {context}")]
    Kube {
        context: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error(transparent)]
    Render(#[from] render::RenderError),
    #[error(transparent)]
    Catalog(#[from] render::CatalogError),
    #[error(transparent)]
    Pki(#[from] pki::PkiError),
    #[error(transparent)]
    Seal(#[from] pki::seal::SealError),
    #[error("{0:?} already exists")]
    Duplicate(String),
    #[error("the generated tenant key is taken")]
    KeyCollision,
    #[error("templates may not create {0}")]
    UnsupportedKind(String),
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("failed to read {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("http server failed")]
    Serve(#[source] std::io::Error),
    #[error("{detail} (HTTP {status}{})", field.as_ref().map(|f| format!(", field {f}")).unwrap_or_default())]
    Api {
        status: u16,
        detail: String,
        field: Option<String>,
    },
    #[error("cannot reach {url}")]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("unexpected answer from {url}")]
    Answer {
        url: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{0}")]
    Client(String),
    #[error("etcd snapshot: {0}")]
    Snapshot(String),
    #[error("shared datastore: {0}")]
    Datastore(String),
    #[error("backup: {0}")]
    Backup(String),
    #[error("backup store: failed to {context}")]
    ObjectStore {
        context: String,
        #[source]
        source: Box<object_store::Error>,
    },
    #[error("etcd: {0}")]
    Etcd(String),
    /// A kubeconfig asked of a tenant whose CA does not exist yet (its bring-up is before its
    /// Certificates step).
    #[error("tenant {0:?} has no CA yet")]
    NoCa(String),
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Error {
        Error::Database(e)
    }
}

impl Error {
    pub fn kube(context: impl Into<String>, source: kube::Error) -> Error {
        Error::Kube {
            context: context.into(),
            source: Box::new(source),
        }
    }

    /// Whether the host answered 404: the object asked for is not there (yet, or any more).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Kube { source, .. }
            if matches!(source.as_ref(), kube::Error::Api(s) if s.code == 404))
    }

    /// The variant's name, as metrics label failures (`vcp_reconcile_errors_total{error}`).
    pub fn variant(&self) -> &'static str {
        match self {
            Error::Database(_) => "database",
            Error::Migrate(_) => "migrate",
            Error::Kube { .. } => "kube",
            Error::Render(_) => "render",
            Error::Catalog(_) => "catalog",
            Error::Pki(_) => "pki",
            Error::Seal(_) => "seal",
            Error::Duplicate(_) => "duplicate",
            Error::KeyCollision => "key_collision",
            Error::UnsupportedKind(_) => "unsupported_kind",
            Error::Config(_) => "config",
            Error::Io { .. } => "io",
            Error::Serve(_) => "serve",
            Error::Api { .. } => "api",
            Error::Http { .. } => "http",
            Error::Answer { .. } => "answer",
            Error::Client(_) => "client",
            Error::Snapshot(_) => "snapshot",
            Error::Datastore(_) => "datastore",
            Error::Backup(_) => "backup",
            Error::ObjectStore { .. } => "object_store",
            Error::Etcd(_) => "etcd",
            Error::NoCa(_) => "no_ca",
        }
    }

    /// A message fit for tenant conditions and API callers: the error and its causes, except
    /// for database errors, whose text may name internals.
    pub fn public(&self) -> String {
        match self {
            Error::Database(_) | Error::Migrate(_) => "the inventory is unavailable".to_owned(),
            // The API's own message says it all; the debug form of its status does not help.
            Error::Kube { context, source } => match source.as_ref() {
                kube::Error::Api(s) => format!("failed to {context}: {} ({})", s.message, s.code),
                // A transport error's own text is only its kind ("client error (Connect)");
                // what failed (a refused connection, a name not found) is in its sources.
                other => format!("failed to {context}: {}", chain(other)),
            },
            other => chain(other),
        }
    }
}

pub use vcp_core::chain;

/// Result with the orchestrator's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Command line of `vcp`.
#[derive(Debug, Parser)]
#[command(
    name = "vcp",
    version,
    about = "Kubernetes control planes as a service"
)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
    /// How log lines look on stderr: `text` for people, `json` (one object per line) for a
    /// log pipeline. `RUST_LOG` filters them.
    #[arg(
        long,
        env = "VCP_LOG_FORMAT",
        value_enum,
        default_value = "text",
        global = true
    )]
    pub log_format: vcp_telemetry::LogFormat,
}

impl Args {
    /// Installs logging as the flags and `RUST_LOG` say.
    pub fn init_logging(&self) {
        vcp_telemetry::init(self.log_format, self.command.default_log_level());
    }
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the API and the reconcile workers (applies migrations first).
    Serve(Box<serve::ServeArgs>),
    /// Apply database migrations and exit.
    Migrate(serve::DatabaseArgs),
    /// Create, list, show and delete tenants.
    #[command(subcommand_value_name = "ACTION")]
    Tenant {
        #[command(flatten)]
        connection: client::Connection,
        #[command(subcommand)]
        action: tenants::cli::TenantCommand,
    },
    /// Fleet upgrades (admins only): move many tenants to a new minor in waves.
    #[command(subcommand_value_name = "ACTION")]
    Upgrade {
        #[command(flatten)]
        connection: client::Connection,
        #[command(subcommand)]
        action: upgrades::cli::UpgradeCommand,
    },
    /// Issue a kubeconfig for a tenant (a client certificate for --user in the --group
    /// groups), or revoke one.
    #[command(subcommand_negates_reqs = true)]
    Kubeconfig {
        #[command(flatten)]
        connection: client::Connection,
        #[command(flatten)]
        args: kubeconfigs::cli::KubeconfigArgs,
        #[command(subcommand)]
        action: Option<kubeconfigs::cli::KubeconfigCommand>,
    },
    /// A tenant user's access: revoke every kubeconfig issued to it.
    User {
        #[command(flatten)]
        connection: client::Connection,
        #[command(subcommand)]
        action: kubeconfigs::cli::UserCommand,
    },
    /// Create, list and revoke API tokens (admins only).
    Token {
        #[command(flatten)]
        connection: client::Connection,
        #[command(subcommand)]
        action: tokens::cli::TokenCommand,
    },
    /// etcd snapshots of a tenant, and restores from them.
    Snapshot {
        #[command(flatten)]
        connection: client::Connection,
        #[command(subcommand)]
        action: snapshots::cli::SnapshotCommand,
    },
    /// Read the audit trail: every change, who made it and when (owners: their tenants').
    Audit {
        #[command(flatten)]
        connection: client::Connection,
        #[command(flatten)]
        args: audit::cli::AuditArgs,
    },
    /// Kubernetes versions tenants can run.
    Version {
        #[command(flatten)]
        connection: client::Connection,
        #[command(subcommand)]
        action: cli::VersionCommand,
    },
    /// Print the platform API's OpenAPI document (what `/openapi.json` serves).
    Openapi,
    /// Commands vcp's own Jobs run in a tenant's control-plane namespace (etcd snapshots and
    /// restores); not for people.
    #[command(hide = true, subcommand)]
    Tool(ToolCommand),
}

/// `vcp tool ...`: what vcp's Jobs run.
#[derive(Debug, clap::Subcommand)]
pub enum ToolCommand {
    #[command(flatten)]
    Snapshots(snapshots::tool::ToolCommand),
    /// Administer a shared datastore as root (what its admin Jobs run).
    Datastore(datastore::tool::Args),
    /// Save a tenant's keys to a logical snapshot and report it (the snapshot Job of a tenant
    /// on a shared datastore).
    EtcdExport(snapshots::transfer::ExportArgs),
    /// Put a logical snapshot's keys in place of a tenant's (its restore Job).
    EtcdImport(snapshots::transfer::ImportArgs),
    /// Add a member to a tenant's etcd as a learner, or promote it (the Jobs of its growth).
    EtcdMember(members::tool::Args),
}

impl Command {
    /// Log level when `RUST_LOG` is unset: the server logs its work; client commands print
    /// for people, and their logs matter only when asked for.
    pub fn default_log_level(&self) -> &'static str {
        match self {
            Command::Serve(_) | Command::Migrate(_) | Command::Tool(_) => "info",
            _ => "warn",
        }
    }
}

/// Runs the command the arguments ask for.
pub async fn run(args: Args) -> Result<()> {
    match args.command {
        Command::Serve(a) => serve::serve(*a).await,
        Command::Migrate(a) => {
            let inv = inventory::Inventory::connect(&a.database_url).await?;
            inv.migrate().await?;
            println!("migrations applied");
            Ok(())
        }
        Command::Tenant { connection, action } => tenants::cli::tenant(&connection, action).await,
        Command::Upgrade { connection, action } => {
            upgrades::cli::upgrade(&connection, action).await
        }
        Command::Kubeconfig {
            connection,
            args,
            action,
        } => match action {
            Some(action) => kubeconfigs::cli::kubeconfig_command(&connection, action).await,
            None => kubeconfigs::cli::kubeconfig(&connection, args).await,
        },
        Command::User { connection, action } => kubeconfigs::cli::user(&connection, action).await,
        Command::Token { connection, action } => tokens::cli::token(&connection, action).await,
        Command::Version { connection, action } => cli::version(&connection, action).await,
        Command::Audit { connection, args } => audit::cli::audit(&connection, args).await,
        Command::Snapshot { connection, action } => {
            snapshots::cli::snapshot(&connection, action).await
        }
        Command::Tool(ToolCommand::Snapshots(cmd)) => snapshots::tool::run(cmd).await,
        Command::Tool(ToolCommand::Datastore(a)) => datastore::tool::run(a).await,
        Command::Tool(ToolCommand::EtcdExport(a)) => snapshots::transfer::export_command(&a).await,
        Command::Tool(ToolCommand::EtcdImport(a)) => snapshots::transfer::import_command(&a).await,
        Command::Tool(ToolCommand::EtcdMember(a)) => members::tool::run(a).await,
        Command::Openapi => {
            let doc = api::openapi()
                .to_pretty_json()
                .map_err(|e| Error::Client(format!("cannot encode the OpenAPI document: {e}")))?;
            client::print(&format!("{doc}\n"))
        }
    }
}

#[cfg(test)]
mod tests {
    use vcp_telemetry::LogFormat;

    #[test]
    fn a_transport_error_says_what_failed_underneath() {
        #[derive(Debug, thiserror::Error)]
        #[error("client error (Connect)")]
        struct Kind(#[source] std::io::Error);
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let e = crate::Error::kube(
            "read the tenant's default namespace",
            kube::Error::Service(Box::new(Kind(refused))),
        );
        let public = e.public();
        assert!(
            public.starts_with("failed to read the tenant's default namespace: ")
                && public.contains("client error (Connect): connection refused"),
            "{public}"
        );
    }

    #[test]
    fn the_flag_goes_anywhere_reads_the_environment_and_refuses_other_formats() {
        use clap::{CommandFactory as _, Parser as _};
        let parse = |args: &[&str]| crate::Args::try_parse_from(args);
        let format = |args: &[&str]| parse(args).unwrap().log_format;
        assert_eq!(format(&["vcp", "openapi"]), LogFormat::Text);
        assert_eq!(
            format(&["vcp", "--log-format", "json", "openapi"]),
            LogFormat::Json
        );
        assert_eq!(
            format(&[
                "vcp",
                "serve",
                "--database-url",
                "postgres://x/y",
                "--log-format",
                "json"
            ]),
            LogFormat::Json
        );
        assert_eq!(
            format(&["vcp", "tenant", "list", "--log-format", "json"]),
            LogFormat::Json
        );
        assert!(parse(&["vcp", "--log-format", "yaml", "openapi"]).is_err());
        let cmd = crate::Args::command();
        let flag = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some("log-format"))
            .unwrap();
        assert_eq!(
            flag.get_env().and_then(|e| e.to_str()),
            Some("VCP_LOG_FORMAT")
        );
        assert!(flag.is_global_set());
    }

    #[test]
    fn kubeconfig_issues_by_default_and_revokes_by_subcommand() {
        use crate::kubeconfigs::cli::{KubeconfigCommand, UserCommand};
        use clap::Parser as _;
        let parse = |args: &[&str]| crate::Args::try_parse_from(args).map(|a| a.command);
        match parse(&["vcp", "kubeconfig", "team-a", "--user", "alice"]).unwrap() {
            crate::Command::Kubeconfig { args, action, .. } => {
                assert_eq!(args.name.as_deref(), Some("team-a"));
                assert_eq!(args.user.as_deref(), Some("alice"));
                assert!(action.is_none());
            }
            c => panic!("{c:?}"),
        }
        match parse(&["vcp", "kubeconfig", "revoke", "team-a", "0abc"]).unwrap() {
            crate::Command::Kubeconfig {
                action: Some(KubeconfigCommand::Revoke { tenant, serial, .. }),
                ..
            } => assert_eq!((tenant.as_str(), serial.as_str()), ("team-a", "0abc")),
            c => panic!("{c:?}"),
        }
        match parse(&["vcp", "user", "revoke", "team-a", "alice"]).unwrap() {
            crate::Command::User {
                action: UserCommand::Revoke { tenant, user, .. },
                ..
            } => assert_eq!((tenant.as_str(), user.as_str()), ("team-a", "alice")),
            c => panic!("{c:?}"),
        }
        // Issuing still needs both, and revoking needs its two arguments.
        assert!(parse(&["vcp", "kubeconfig", "team-a"]).is_err());
        assert!(parse(&["vcp", "kubeconfig", "--user", "alice"]).is_err());
        assert!(parse(&["vcp", "kubeconfig", "revoke", "team-a"]).is_err());
    }
}
