//! The one error type of `vcp-dev`.

use std::path::PathBuf;

/// Everything that can go wrong while starting, inspecting or stopping a dev cluster.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "{component} {version} is not built (looked for {path}); build it with `tests/kube-bin/build.sh`"
    )]
    MissingBinary {
        component: String,
        version: String,
        path: PathBuf,
    },
    #[error(
        "state dir {dir} is already running ({component} has pid {pid}); stop it first with `vcp-dev down --state-dir {dir}`"
    )]
    AlreadyRunning {
        dir: PathBuf,
        component: String,
        pid: u32,
    },
    #[error("invalid option: {0}")]
    InvalidOption(String),
    #[error("no dev cluster was ever started in {0} (no state.json)")]
    NoState(PathBuf),
    #[error("failed to start {component}")]
    Spawn {
        component: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{component} exited during startup ({status}); last lines of {log}:\n{tail}")]
    Exited {
        component: String,
        status: String,
        log: PathBuf,
        tail: String,
    },
    #[error("{component} was not healthy after {secs}s; see {log}")]
    Unhealthy {
        component: String,
        secs: u64,
        log: PathBuf,
    },
    #[error("{what} did not happen within {secs}s")]
    Timeout { what: String, secs: u64 },
    #[error("failed to access {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "postgres is not installed ({0} is missing); install it with `apt-get install -y postgresql`"
    )]
    PostgresMissing(PathBuf),
    #[error("failed to {0}")]
    Postgres(String, #[source] Option<sqlx::Error>),
    #[error("failed to {context}")]
    Kube {
        context: String,
        #[source]
        source: kube::Error,
    },
    #[error("invalid kubeconfig")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error("failed to generate certificates")]
    Pki(#[from] vcp_pki::PkiError),
    #[error("failed to encode or decode {what}")]
    Serde {
        what: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("user {0} does not exist; postgres cannot run as root")]
    NoSuchUser(String),
    #[error("helm {args} failed:\n{output}")]
    Helm { args: String, output: String },
    #[error("image: {0}")]
    Image(String),
    #[error("real node: {0}")]
    Node(String),
    #[error("{what} did not happen within {secs}s:\n{detail}")]
    NotReady {
        what: String,
        secs: u64,
        detail: String,
    },
}

/// Result with `vcp-dev`'s error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { path, source }
    }

    pub(crate) fn kube(context: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let context = context.into();
        move |source| Error::Kube { context, source }
    }
}
