use clap::Parser;
use std::path::PathBuf;

/// A minimal kubelet for the vcp dev cluster: runs the pods bound to its node as processes.
#[derive(Debug, Parser)]
#[command(name = "vcp-devnode", version)]
struct Args {
    /// Kubeconfig of the host cluster.
    #[arg(long, env = "VCP_DEVNODE_KUBECONFIG")]
    kubeconfig: PathBuf,
    /// Name of the Node to register.
    #[arg(long, env = "VCP_DEVNODE_NAME", default_value = "devnode-0")]
    node_name: String,
    /// Directory for pod volumes and container logs.
    #[arg(long, env = "VCP_DEVNODE_STATE_DIR")]
    state_dir: PathBuf,
    /// Where tests/kube-bin/build.sh put the Kubernetes binaries.
    #[arg(long, env = "VCP_BIN_DIR")]
    bin_dir: Option<PathBuf>,
    /// Where the workspace's binaries (vcp-syncer) are; default: next to this binary.
    #[arg(long, env = "VCP_WORKSPACE_BIN_DIR")]
    workspace_bin_dir: Option<PathBuf>,
    /// Debian's PostgreSQL installations (`<dir>/<major>/bin`), for `postgres` images.
    #[arg(long, env = "VCP_DEVNODE_POSTGRES_DIR", default_value = vcp_devnode::images::DEBIAN_POSTGRES_DIR)]
    postgres_dir: PathBuf,
    /// Kubelet version to report.
    #[arg(long, env = "VCP_DEVNODE_VERSION", default_value = vcp_dev::bins::host_kubernetes_version())]
    kubelet_version: String,
    /// Serving certificate of the kubelet endpoint (`kubectl logs`); without it, none is served.
    #[arg(long, env = "VCP_DEVNODE_TLS_CERT_FILE", requires_all = ["tls_private_key_file", "client_ca_file"])]
    tls_cert_file: Option<PathBuf>,
    /// Its key.
    #[arg(long, env = "VCP_DEVNODE_TLS_PRIVATE_KEY_FILE")]
    tls_private_key_file: Option<PathBuf>,
    /// CA that signs the clients admitted to the kubelet endpoint (the host apiserver's).
    #[arg(long, env = "VCP_DEVNODE_CLIENT_CA_FILE")]
    client_ca_file: Option<PathBuf>,
    /// Port of the kubelet endpoint on 127.0.0.1; 0 picks a free one.
    #[arg(long, env = "VCP_DEVNODE_KUBELET_PORT", default_value_t = 0)]
    kubelet_port: u16,
    /// Log as JSON lines.
    #[arg(long, env = "VCP_LOG_JSON")]
    log_json: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "warn,vcp_devnode=info".into());
    let fmt = tracing_subscriber::fmt().with_env_filter(filter);
    if args.log_json {
        fmt.json().init();
    } else {
        fmt.init();
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let exe_dir = std::env::current_exe()?
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default();
    let cfg = vcp_devnode::Config {
        kubeconfig: args.kubeconfig,
        node_name: args.node_name,
        state_dir: args.state_dir,
        images: vcp_devnode::images::ImageDirs {
            bin_dir: args.bin_dir.unwrap_or_else(vcp_dev::bins::bin_dir),
            workspace_bin_dir: args.workspace_bin_dir.unwrap_or(exe_dir),
            postgres_dir: args.postgres_dir,
            host_path: std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).collect())
                .unwrap_or_default(),
        },
        version: args.kubelet_version,
        kubelet: match (
            args.tls_cert_file,
            args.tls_private_key_file,
            args.client_ca_file,
        ) {
            (Some(cert), Some(key), Some(client_ca)) => Some(vcp_devnode::KubeletConfig {
                port: args.kubelet_port,
                tls: vcp_devnode::kubelet::TlsFiles {
                    cert,
                    key,
                    client_ca,
                },
            }),
            _ => None,
        },
    };
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    vcp_devnode::run(cfg, shutdown).await?;
    Ok(())
}
