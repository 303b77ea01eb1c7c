// jemalloc, not the system allocator: about 14 % less CPU on the pod pass at the same memory
// (docs/benchmarks.md, "The allocator").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    vcp_syncer::Command::parse_from(std::env::args_os())
        .run()
        .await?;
    Ok(())
}
