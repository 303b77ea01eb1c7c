//! A throwaway PostgreSQL from Debian's binaries.
//!
//! `initdb` into a fresh directory, a free port on 127.0.0.1, the socket inside the directory
//! and durability off (fsync, synchronous commit, full-page writes): the data is disposable and
//! speed matters. As root, the server runs as the `postgres` user, because postgres refuses to
//! run as root.

use crate::process::{self, ProcSpec, Spawned, Supervision};
use crate::{Error, Result};
use sqlx::Connection;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where Debian installs the server.
pub const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

const PG_USER: &str = "postgres";

/// A running server whose data lives under a directory (`<dir>/data`, socket in `<dir>`).
#[derive(Debug)]
pub struct PgServer {
    pub port: u16,
    pub url: String,
    pub proc: Spawned,
}

fn pg_bin(name: &str) -> Result<PathBuf> {
    let path = Path::new(PG_BIN).join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::PostgresMissing(path))
    }
}

/// Gives the server's user the directory (only needed when we are root).
fn hand_over(dir: &Path) -> Result<Option<String>> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    let user = nix::unistd::User::from_name(PG_USER)
        .ok()
        .flatten()
        .ok_or_else(|| Error::NoSuchUser(PG_USER.into()))?;
    std::os::unix::fs::chown(dir, Some(user.uid.as_raw()), Some(user.gid.as_raw()))
        .map_err(Error::io(dir))?;
    Ok(Some(PG_USER.to_owned()))
}

/// Initialises `<dir>/data` unless it exists, starts the server and waits until it accepts
/// connections.
pub async fn start_in(dir: &Path, log: &Path, mode: Supervision) -> Result<PgServer> {
    start_on(dir, log, mode, None).await
}

/// [`start_in`] on a given port (a restart keeps its URL), or a free one.
pub async fn start_on(
    dir: &Path,
    log: &Path,
    mode: Supervision,
    port: Option<u16>,
) -> Result<PgServer> {
    let initdb = pg_bin("initdb")?;
    let postgres = pg_bin("postgres")?;
    std::fs::create_dir_all(dir).map_err(Error::io(dir))?;
    let run_as = hand_over(dir)?;
    let data = dir.join("data");
    if !data.join("PG_VERSION").exists() {
        let mut spec = ProcSpec::new("initdb", initdb).args([
            "-D",
            path_str(&data),
            "-U",
            PG_USER,
            "--auth=trust",
            "--encoding=UTF8",
            "--no-sync",
            "--no-instructions",
        ]);
        spec.run_as = run_as.clone();
        let mut p = process::spawn(&spec, Supervision::Attached, log)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while p.check_running().is_ok() {
            if Instant::now() > deadline {
                p.stop(Duration::ZERO);
                return Err(Error::Timeout {
                    what: "initdb".into(),
                    secs: 60,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if !data.join("PG_VERSION").exists() {
            return Err(Error::Postgres(
                format!("initdb {}: {}", data.display(), process::log_tail(log, 10)),
                None,
            ));
        }
    }
    let port = match port {
        Some(p) => p,
        None => process::free_ports::<1>()?[0],
    };
    let mut spec = ProcSpec::new("postgres", postgres).args([
        "-D",
        path_str(&data),
        "-p",
        &port.to_string(),
        "-k",
        path_str(dir),
        "-c",
        "listen_addresses=127.0.0.1",
        "-c",
        "fsync=off",
        "-c",
        "synchronous_commit=off",
        "-c",
        "full_page_writes=off",
        "-c",
        "max_connections=300",
    ]);
    spec.run_as = run_as;
    let mut proc = process::spawn(&spec, mode, log)?;
    let url = format!("postgres://{PG_USER}@127.0.0.1:{port}/postgres");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        proc.check_running()?;
        match sqlx::PgConnection::connect(&url).await {
            Ok(conn) => {
                let _ = conn.close().await;
                break;
            }
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => {
                proc.stop(Duration::from_secs(5));
                return Err(Error::Postgres(
                    format!("connect to postgres at {url}"),
                    Some(e),
                ));
            }
        }
    }
    Ok(PgServer { port, url, proc })
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("state paths are UTF-8")
}

/// A Postgres for one test: started in a temporary directory, stopped and removed on drop.
#[derive(Debug)]
pub struct EphemeralPostgres {
    server: PgServer,
    dir: tempfile::TempDir,
}

impl EphemeralPostgres {
    /// Starts a fresh server.
    pub async fn start() -> Result<EphemeralPostgres> {
        let dir = tempfile::Builder::new()
            .prefix("vcp-pg-")
            .tempdir()
            .map_err(Error::io(std::env::temp_dir()))?;
        let log = dir.path().join("postgres.log");
        let server = start_in(dir.path(), &log, Supervision::Attached).await?;
        Ok(EphemeralPostgres { server, dir })
    }

    /// Connection URL of the `postgres` database.
    pub fn url(&self) -> &str {
        &self.server.url
    }

    /// Creates a database and returns its URL, so tests sharing a server stay apart.
    pub async fn create_database(&self, name: &str) -> Result<String> {
        let valid = !name.is_empty()
            && name.len() <= 63
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !valid {
            return Err(Error::Postgres(
                format!("create database {name:?}: use 1-63 characters of [a-z0-9_]"),
                None,
            ));
        }
        let mut conn = sqlx::PgConnection::connect(self.url())
            .await
            .map_err(|e| Error::Postgres("connect to postgres".into(), Some(e)))?;
        // The name was checked above; identifiers cannot be bound as parameters.
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut conn)
            .await
            .map_err(|e| Error::Postgres(format!("create database {name}"), Some(e)))?;
        Ok(format!(
            "postgres://{PG_USER}@127.0.0.1:{}/{name}",
            self.server.port
        ))
    }

    /// Stops the server at once (SIGKILL, like a crash) and starts it again on the same port
    /// with the same data; returns once it accepts connections.
    pub async fn restart(&mut self) -> Result<()> {
        let segment = shared_memory_id(&self.dir.path().join("data"));
        self.server.proc.stop(Duration::ZERO);
        // Backends outlive a killed postmaster by a moment (they notice and exit), and a new
        // postmaster refuses to start while its old segment has anyone attached.
        if let Some(id) = segment {
            let t0 = std::time::Instant::now();
            while attached(&id) && t0.elapsed() < Duration::from_secs(30) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let log = self.dir.path().join("postgres.log");
        self.server = start_on(
            self.dir.path(),
            &log,
            Supervision::Attached,
            Some(self.server.port),
        )
        .await?;
        Ok(())
    }

    /// The server's pid (its process group holds every backend).
    pub fn pid(&self) -> u32 {
        self.server.proc.pid
    }

    /// The directory holding data and socket.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// The shared memory segment a running postmaster of `data` holds: the id on the last line
/// of `postmaster.pid` ("<key> <id>").
fn shared_memory_id(data: &Path) -> Option<String> {
    let pid_file = std::fs::read_to_string(data.join("postmaster.pid")).ok()?;
    let line = pid_file.lines().nth(6)?;
    line.split_whitespace().nth(1).map(str::to_owned)
}

/// Whether any process is still attached to System V segment `id`.
fn attached(id: &str) -> bool {
    let table = std::fs::read_to_string("/proc/sysvipc/shm").unwrap_or_default();
    table.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.get(1) == Some(&id) && f.get(6).is_some_and(|n| *n != "0")
    })
}

impl Drop for EphemeralPostgres {
    fn drop(&mut self) {
        // SIGTERM is postgres' "smart" shutdown; with nothing to wait for it is quick, and the
        // group kill after the grace period covers a stuck backend.
        self.server.proc.stop(Duration::from_secs(10));
    }
}
