use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = vcp_orchestrator::Args::parse();
    let default_level = args.command.default_log_level();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_level.into()),
        )
        // stdout is for what a person must read (the first admin token, `migrate`'s result).
        .with_writer(std::io::stderr)
        .init();
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a TLS provider was already installed"))?;
    if let Err(e) = vcp_orchestrator::run(args).await {
        // One line a person can act on; the debug chain adds nothing for a CLI user.
        eprintln!("error: {}", vcp_orchestrator::chain(&e));
        std::process::exit(1);
    }
    Ok(())
}
