//! `vcp-devnode-postgres`: the entrypoint of the devnode's Postgres image (see
//! `vcp_devnode::postgres`): initialise an empty data directory as the official image does,
//! then become `postgres`.

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Returns only on failure: success replaces this process.
    let Err(e) = vcp_devnode::postgres::run(&args);
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        msg.push_str(&format!(": {s}"));
        source = s.source();
    }
    tracing::error!("{msg}");
    std::process::ExitCode::FAILURE
}
