use clap::Parser;

fn main() -> anyhow::Result<()> {
    vcp_syncer::run(vcp_syncer::Args::parse())?;
    Ok(())
}
