use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = vcp_syncer::Args::parse();
    vcp_telemetry::init(args.log_format, vcp_syncer::DEFAULT_LOG_LEVEL);
    vcp_syncer::run(args).await?;
    Ok(())
}
