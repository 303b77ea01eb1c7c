//! The devnode's Postgres image entrypoint (`vcp-devnode-postgres`) against Debian's real
//! PostgreSQL 15, outside any cluster: it initialises an empty data directory with the user,
//! password and database the chart's environment names, runs the server as the `postgres`
//! user when started as root, and starts again on the same data without initialising twice.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use vcp_dev::process::{self, ProcSpec, Spawned, Supervision};

type Res<T = ()> = anyhow::Result<T>;

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// What these tests need, which `tests/setup.sh` installs and CI has: a missing part fails
/// the test with its name, rather than passing without having run.
fn prerequisites() -> Res {
    anyhow::ensure!(
        Path::new(PG_BIN).join("postgres").is_file(),
        "{PG_BIN}/postgres is missing: install Debian's postgresql-15 (tests/setup.sh does)"
    );
    anyhow::ensure!(
        nix::unistd::geteuid().is_root(),
        "the entrypoint's root path (chown, setpriv) needs root: run the tests as root, as CI does"
    );
    Ok(())
}

struct Server {
    proc: Spawned,
    port: u16,
    log: PathBuf,
}

/// Starts the entrypoint as the container would, with the chart's environment.
fn start(dir: &Path, password: Option<&str>, port: u16) -> Res<Server> {
    let log = dir.join("postgres.log");
    let sock = dir.join("sock");
    std::fs::create_dir_all(&sock)?;
    let pg = nix::unistd::User::from_name("postgres")?
        .ok_or_else(|| anyhow::anyhow!("no postgres user"))?;
    std::os::unix::fs::chown(&sock, Some(pg.uid.as_raw()), Some(pg.gid.as_raw()))?;
    let mut spec = ProcSpec::new("postgres-image", env!("CARGO_BIN_EXE_vcp-devnode-postgres"))
        .args([
            "postgres".to_owned(),
            "-p".into(),
            port.to_string(),
            "-k".into(),
            sock.display().to_string(),
            // The image listens everywhere; on this machine only loopback may be used.
            "-c".into(),
            "listen_addresses=127.0.0.1".into(),
        ]);
    spec.clear_env = true;
    spec.env = vec![
        ("PATH".into(), format!("{PG_BIN}:/usr/bin:/bin")),
        ("LANG".into(), "C.UTF-8".into()),
        ("POSTGRES_USER".into(), "vcp".into()),
        ("POSTGRES_DB".into(), "vcp".into()),
        (
            "PGDATA".into(),
            dir.join("data/pgdata").display().to_string(),
        ),
    ];
    if let Some(p) = password {
        spec.env.push(("POSTGRES_PASSWORD".into(), p.into()));
    }
    let proc = process::spawn(&spec, Supervision::Attached, &log)?;
    Ok(Server { proc, port, log })
}

fn psql(port: u16, sql: &str) -> Res<String> {
    let out = Command::new(Path::new(PG_BIN).join("psql"))
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "vcp",
            "-d",
            "vcp",
        ])
        .args(["-At", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "psql {sql:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn wait_ready(s: &mut Server) -> Res {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Err(e) = s.proc.check_running() {
            anyhow::bail!("the entrypoint exited: {e}");
        }
        let ok = Command::new(Path::new(PG_BIN).join("pg_isready"))
            .args(["-h", "127.0.0.1", "-p", &s.port.to_string(), "-U", "vcp"])
            .output()?
            .status
            .success();
        if ok {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "not ready after 90 s: {}",
            process::log_tail(&s.log, 20)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn uid_of(pid: u32) -> Res<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .ok_or_else(|| anyhow::anyhow!("no Uid line"))?;
    Ok(line.split_whitespace().nth(1).unwrap_or_default().parse()?)
}

fn tempdir() -> Res<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new().prefix("vcp-pg-image-").tempdir()?;
    // The server runs as postgres and must reach its data below this directory.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    Ok(dir)
}

#[test]
fn an_empty_data_dir_is_initialised_with_the_charts_user_password_and_database() -> Res {
    prerequisites()?;
    let dir = tempdir()?;
    let port = process::free_ports::<1>()?[0];
    let mut s = start(dir.path(), Some("s3cret-pw"), port)?;
    wait_ready(&mut s)?;

    // Started as root, the server runs as the postgres user; the entrypoint became it (one pid).
    let pg = nix::unistd::User::from_name("postgres")?.unwrap();
    assert_eq!(
        uid_of(s.proc.pid)?,
        pg.uid.as_raw(),
        "the server is not root"
    );
    assert_eq!(
        std::fs::read_link(format!("/proc/{}/exe", s.proc.pid))?,
        Path::new(PG_BIN).join("postgres"),
        "the entrypoint replaced itself with postgres"
    );
    assert_eq!(
        psql(port, "SELECT current_user || '/' || current_database()")?,
        "vcp/vcp"
    );
    assert_eq!(
        psql(
            port,
            "SELECT rolsuper, rolpassword LIKE 'SCRAM-SHA-256$%' FROM pg_authid WHERE rolname = 'vcp'"
        )?,
        "t|t",
        "POSTGRES_USER is the superuser, with POSTGRES_PASSWORD stored as SCRAM"
    );
    // Local connections are trusted; any other address needs the password, as in the image.
    let last_rule = psql(
        port,
        "SELECT type || ' ' || array_to_string(database, ',') || ' ' || array_to_string(user_name, ',') \
         || ' ' || coalesce(address, '') || ' ' || auth_method FROM pg_hba_file_rules ORDER BY line_number DESC LIMIT 1",
    )?;
    assert_eq!(last_rule, "host all all all scram-sha-256");
    let conf = std::fs::read_to_string(dir.path().join("data/pgdata/postgresql.conf"))?;
    assert!(
        conf.contains("\nlisten_addresses = '*'\n"),
        "listens everywhere in its pod"
    );
    assert_eq!(psql(port, "SHOW server_encoding")?, "UTF8");
    psql(
        port,
        "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('before')",
    )?;
    s.proc.stop(Duration::from_secs(10));

    // Again on the same data: no second initdb, the data is there.
    let mut s = start(dir.path(), Some("s3cret-pw"), port)?;
    wait_ready(&mut s)?;
    assert_eq!(psql(port, "SELECT v FROM kept")?, "before");
    let log = std::fs::read_to_string(&s.log)?;
    assert_eq!(
        log.matches("initialising the database").count(),
        1,
        "initialised once: {log}"
    );
    s.proc.stop(Duration::from_secs(10));
    Ok(())
}

#[test]
fn without_a_password_an_empty_data_dir_is_refused() -> Res {
    prerequisites()?;
    let dir = tempdir()?;
    let port = process::free_ports::<1>()?[0];
    let mut s = start(dir.path(), None, port)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.proc.check_running().is_ok() {
        anyhow::ensure!(Instant::now() < deadline, "the entrypoint kept running");
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = std::fs::read_to_string(&s.log)?;
    assert!(log.contains("superuser password is not specified"), "{log}");
    assert!(
        !dir.path().join("data/pgdata/PG_VERSION").exists(),
        "nothing was initialised"
    );
    Ok(())
}
