use clap::Parser;

fn main() -> anyhow::Result<()> {
    vcp_orchestrator::run(vcp_orchestrator::Args::parse())?;
    Ok(())
}
