// jemalloc, not the system allocator: about 14 % less CPU on the pod pass at the same memory
// (docs/benchmarks.md, "The allocator and the runtime").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> anyhow::Result<()> {
    let command = vcp_syncer::Command::parse_from(std::env::args_os());
    command.runtime()?.block_on(command.run())?;
    Ok(())
}
