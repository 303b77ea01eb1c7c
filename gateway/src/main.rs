//! `vcp-gateway`: parses the flags, sets up logging, runs [`vcp_gateway::run`].

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = vcp_gateway::Args::parse();
    vcp_telemetry::init(args.log_format, vcp_gateway::DEFAULT_LOG_LEVEL);
    vcp_gateway::run(args).await?;
    Ok(())
}
