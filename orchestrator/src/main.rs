use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = vcp_orchestrator::Args::parse();
    args.init_logging();
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
