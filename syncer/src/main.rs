#[tokio::main]
async fn main() -> anyhow::Result<()> {
    vcp_syncer::Command::parse_from(std::env::args_os())
        .run()
        .await?;
    Ok(())
}
