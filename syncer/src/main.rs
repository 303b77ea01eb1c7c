use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = vcp_syncer::Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,vcp_syncer=info".into()),
        )
        .init();
    vcp_syncer::run(args).await?;
    Ok(())
}
