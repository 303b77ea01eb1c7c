use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = vcp_syncer::Args::parse();
    vcp_syncer::init_logging(args.log_format);
    vcp_syncer::run(args).await?;
    Ok(())
}
