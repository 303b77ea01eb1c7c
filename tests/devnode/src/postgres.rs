//! The Postgres image's entrypoint (`vcp-devnode-postgres`), standing in for the official
//! image's `docker-entrypoint.sh` on the devnode.
//!
//! What it does, as far as vcp's chart relies on the official one:
//! 1. Run as root, it gives `PGDATA` and the socket directory to the image's `postgres` user
//!    and runs itself again as that user (the official image uses gosu). Run as any other uid
//!    (the chart's `runAsUser: 999`), it goes on as that uid.
//! 2. It creates `PGDATA` if needed and makes it 0700 (Postgres refuses a group-writable data
//!    directory, which an `fsGroup` leaves).
//! 3. On an empty data directory: `initdb` with `POSTGRES_USER` as the superuser and
//!    `POSTGRES_PASSWORD` as its password (plus `POSTGRES_INITDB_ARGS`), `listen_addresses = '*'`,
//!    a last `pg_hba.conf` line `host all all all <POSTGRES_HOST_AUTH_METHOD, default
//!    scram-sha-256>` (so local connections are trusted, everything else needs the password),
//!    and `POSTGRES_DB` created unless it is `postgres` (in single-user mode: no server has to
//!    listen anywhere meanwhile).
//! 4. It execs `postgres` with the container's arguments.
//!
//! `VAR_FILE` forms of the user, password and database are read as the official image reads
//! them. What it does not do fails loudly rather than silently differing:
//! `POSTGRES_INITDB_WALDIR`, and scripts in `/docker-entrypoint-initdb.d`. A first argument
//! other than `postgres` (or an option) is executed as given, without initialisation, as the
//! official entrypoint does.
//!
//! The plan ([`Settings`], [`initdb_args`], [`hba_line`], [`create_database`]) is pure and
//! tested in place; [`run`] does the I/O, tested against the real server in
//! `tests/postgres_image.rs`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where the official image puts initialisation scripts; the devnode runs none.
pub const INITDB_SCRIPTS: &str = "/docker-entrypoint-initdb.d";
/// The official image's socket directory.
pub const SOCKET_DIR: &str = "/var/run/postgresql";

/// Why the entrypoint stops.
#[derive(Debug, thiserror::Error)]
pub enum EntrypointError {
    #[error("both {0} and {0}_FILE are set; set one")]
    Both(String),
    #[error("failed to read {var} from {path}")]
    ReadFile {
        var: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "database is uninitialized and superuser password is not specified: set POSTGRES_PASSWORD (or POSTGRES_HOST_AUTH_METHOD=trust)"
    )]
    NoPassword,
    #[error("{0} is not supported by the devnode's postgres image")]
    Unsupported(String),
    #[error("the image has no user {0:?}")]
    NoUser(String),
    #[error("failed to prepare {path}")]
    Prepare {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to run {program}")]
    Run {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} failed: {status}")]
    Failed { program: String, status: String },
}

/// What the environment asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub user: String,
    pub password: Option<String>,
    pub db: String,
    pub pgdata: PathBuf,
    pub host_auth: String,
    pub initdb_args: Vec<String>,
}

/// Reads the settings from `env`, with `read` for the `_FILE` forms.
pub fn settings(
    env: &BTreeMap<String, String>,
    read: impl Fn(&Path) -> std::io::Result<String>,
) -> Result<Settings, EntrypointError> {
    let var = |name: &str| -> Result<Option<String>, EntrypointError> {
        let file = format!("{name}_FILE");
        match (env.get(name), env.get(&file)) {
            (Some(_), Some(_)) => Err(EntrypointError::Both(name.to_owned())),
            (Some(v), None) => Ok(Some(v.clone())),
            (None, Some(path)) => {
                let path = PathBuf::from(path);
                read(&path)
                    .map(|v| Some(v.trim_end_matches('\n').to_owned()))
                    .map_err(|source| EntrypointError::ReadFile {
                        var: name.to_owned(),
                        path,
                        source,
                    })
            }
            (None, None) => Ok(None),
        }
    };
    if env.contains_key("POSTGRES_INITDB_WALDIR") {
        return Err(EntrypointError::Unsupported(
            "POSTGRES_INITDB_WALDIR".into(),
        ));
    }
    let user = var("POSTGRES_USER")?
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "postgres".into());
    let db = var("POSTGRES_DB")?
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| user.clone());
    Ok(Settings {
        password: var("POSTGRES_PASSWORD")?.filter(|p| !p.is_empty()),
        db,
        user,
        pgdata: env
            .get("PGDATA")
            .map_or_else(|| "/var/lib/postgresql/data".into(), PathBuf::from),
        host_auth: env
            .get("POSTGRES_HOST_AUTH_METHOD")
            .filter(|a| !a.is_empty())
            .cloned()
            .unwrap_or_else(|| "scram-sha-256".into()),
        initdb_args: env
            .get("POSTGRES_INITDB_ARGS")
            .map(|a| a.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default(),
    })
}

/// What the container's arguments ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// The server, with these arguments: initialise first if needed.
    Server(Vec<String>),
    /// Anything else, run as given.
    Other(Vec<String>),
}

/// Options alone mean the server, as with the official entrypoint; no arguments at all too.
pub fn start_of(args: &[String]) -> Start {
    match args.first().map(String::as_str) {
        None => Start::Server(Vec::new()),
        Some(a) if a.starts_with('-') => Start::Server(args.to_vec()),
        Some("postgres") => Start::Server(args[1..].to_vec()),
        Some(_) => Start::Other(args.to_vec()),
    }
}

/// `initdb`'s arguments; the password, if any, comes on its standard input.
pub fn initdb_args(s: &Settings) -> Result<Vec<String>, EntrypointError> {
    if s.password.is_none() && s.host_auth != "trust" {
        return Err(EntrypointError::NoPassword);
    }
    let mut args = vec![
        format!("--pgdata={}", s.pgdata.display()),
        format!("--username={}", s.user),
    ];
    if s.password.is_some() {
        args.push("--pwfile=/dev/stdin".into());
    }
    args.extend(s.initdb_args.iter().cloned());
    Ok(args)
}

/// The line appended to `pg_hba.conf`: any address, any user, with the host auth method.
pub fn hba_line(s: &Settings) -> String {
    format!("host all all all {}\n", s.host_auth)
}

/// The single-user command that creates the database, unless it is `postgres` (which
/// `initdb` made).
pub fn create_database(s: &Settings) -> Option<String> {
    (s.db != "postgres").then(|| format!("CREATE DATABASE \"{}\";\n", s.db.replace('"', "\"\"")))
}

/// Runs the entrypoint with the container's arguments; returns only on failure (success
/// replaces this process with the server or the command).
pub fn run(args: &[String]) -> Result<Infallible, EntrypointError> {
    let env: BTreeMap<String, String> = std::env::vars().collect();
    let server_args = match start_of(args) {
        Start::Other(cmd) => return exec(&cmd[0], &cmd[1..]),
        Start::Server(a) => a,
    };
    let s = settings(&env, |p| std::fs::read_to_string(p))?;
    if nix::unistd::geteuid().is_root() {
        return drop_to_postgres(&s, args);
    }
    let prepare = |source| EntrypointError::Prepare {
        path: s.pgdata.clone(),
        source,
    };
    std::fs::create_dir_all(&s.pgdata).map_err(prepare)?;
    // A data directory Postgres accepts: an fsGroup made it group-writable.
    set_mode(&s.pgdata, 0o700).map_err(prepare)?;
    if !s.pgdata.join("PG_VERSION").exists() {
        initialise(&s)?;
    }
    exec("postgres", &server_args)
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

fn initialise(s: &Settings) -> Result<(), EntrypointError> {
    let scripts = std::fs::read_dir(INITDB_SCRIPTS)
        .map(|d| d.count())
        .unwrap_or(0);
    if scripts > 0 {
        return Err(EntrypointError::Unsupported(format!(
            "scripts in {INITDB_SCRIPTS}"
        )));
    }
    tracing::info!(pgdata = %s.pgdata.display(), user = %s.user, db = %s.db, "initialising the database");
    let args = initdb_args(s)?;
    run_with_input("initdb", &args, s.password.as_deref())?;
    let append = |file: &str, text: &str| {
        let path = s.pgdata.join(file);
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(|source| EntrypointError::Prepare { path, source })
    };
    append("postgresql.conf", "\nlisten_addresses = '*'\n")?;
    append("pg_hba.conf", &format!("\n{}", hba_line(s)))?;
    if let Some(sql) = create_database(s) {
        let pgdata = s.pgdata.display().to_string();
        run_with_input(
            "postgres",
            &["--single".into(), "-D".into(), pgdata, "postgres".into()],
            Some(&sql),
        )?;
    }
    tracing::info!("PostgreSQL init process complete; ready for start up");
    Ok(())
}

/// Runs `program` (from `PATH`) with `input` on its standard input; its output goes to ours.
fn run_with_input(
    program: &str,
    args: &[String],
    input: Option<&str>,
) -> Result<(), EntrypointError> {
    let run_err = |source| EntrypointError::Run {
        program: program.to_owned(),
        source,
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .spawn()
        .map_err(run_err)?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    if let Some(text) = input {
        // initdb reads the password file's first line; keep it one line.
        stdin.write_all(text.as_bytes()).map_err(run_err)?;
        if !text.ends_with('\n') {
            stdin.write_all(b"\n").map_err(run_err)?;
        }
    }
    drop(stdin);
    let status = child.wait().map_err(run_err)?;
    if !status.success() {
        return Err(EntrypointError::Failed {
            program: program.to_owned(),
            status: status.to_string(),
        });
    }
    Ok(())
}

/// As root: the data and socket directories go to the image's `postgres` user, then this
/// entrypoint runs again as that user (still dying with the devnode).
fn drop_to_postgres(s: &Settings, args: &[String]) -> Result<Infallible, EntrypointError> {
    let user = nix::unistd::User::from_name("postgres")
        .ok()
        .flatten()
        .ok_or_else(|| EntrypointError::NoUser("postgres".into()))?;
    for dir in [s.pgdata.as_path(), Path::new(SOCKET_DIR)] {
        std::fs::create_dir_all(dir).map_err(|source| EntrypointError::Prepare {
            path: dir.to_owned(),
            source,
        })?;
        chown_tree(dir, user.uid.as_raw(), user.gid.as_raw()).map_err(|source| {
            EntrypointError::Prepare {
                path: dir.to_owned(),
                source,
            }
        })?;
    }
    let me = std::env::current_exe().map_err(|source| EntrypointError::Run {
        program: "/proc/self/exe".into(),
        source,
    })?;
    let mut setpriv = vec![
        format!("--reuid={}", user.uid),
        format!("--regid={}", user.gid),
        "--clear-groups".into(),
        "--pdeathsig=KILL".into(),
        "--".into(),
        me.display().to_string(),
    ];
    setpriv.extend(args.iter().cloned());
    exec("setpriv", &setpriv)
}

fn chown_tree(dir: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(dir, Some(uid), Some(gid))?;
    if std::fs::symlink_metadata(dir)?.is_dir() {
        for entry in std::fs::read_dir(dir)? {
            chown_tree(&entry?.path(), uid, gid)?;
        }
    }
    Ok(())
}

fn exec(program: &str, args: &[String]) -> Result<Infallible, EntrypointError> {
    let source = Command::new(program).args(args).exec();
    Err(EntrypointError::Run {
        program: program.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn no_files(p: &Path) -> std::io::Result<String> {
        Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            p.display().to_string(),
        ))
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| (*x).to_owned()).collect()
    }

    #[test]
    fn the_charts_environment_initialises_user_password_and_database() {
        let chart = env(&[
            ("POSTGRES_USER", "vcp"),
            ("POSTGRES_DB", "vcp"),
            ("POSTGRES_PASSWORD", "s3cret"),
            ("PGDATA", "/var/lib/postgresql/data/pgdata"),
        ]);
        let st = settings(&chart, no_files).unwrap();
        assert_eq!(
            initdb_args(&st).unwrap(),
            [
                "--pgdata=/var/lib/postgresql/data/pgdata",
                "--username=vcp",
                "--pwfile=/dev/stdin"
            ]
        );
        assert_eq!(st.password.as_deref(), Some("s3cret"));
        assert_eq!(hba_line(&st), "host all all all scram-sha-256\n");
        assert_eq!(
            create_database(&st).as_deref(),
            Some("CREATE DATABASE \"vcp\";\n")
        );
    }

    #[test]
    fn defaults_follow_the_official_image() {
        let st = settings(&env(&[("POSTGRES_PASSWORD", "p")]), no_files).unwrap();
        assert_eq!(st.user, "postgres");
        assert_eq!(st.db, "postgres");
        assert_eq!(st.pgdata, Path::new("/var/lib/postgresql/data"));
        assert_eq!(create_database(&st), None, "initdb made it");
        let st = settings(&env(&[("POSTGRES_USER", "app")]), no_files).unwrap();
        assert_eq!(st.db, "app", "the database defaults to the user's name");
        assert!(matches!(initdb_args(&st), Err(EntrypointError::NoPassword)));
        let st = settings(
            &env(&[
                ("POSTGRES_HOST_AUTH_METHOD", "trust"),
                ("POSTGRES_INITDB_ARGS", "--data-checksums  -E UTF8"),
                ("POSTGRES_DB", "we\"ird"),
            ]),
            no_files,
        )
        .unwrap();
        assert_eq!(
            initdb_args(&st).unwrap(),
            [
                "--pgdata=/var/lib/postgresql/data",
                "--username=postgres",
                "--data-checksums",
                "-E",
                "UTF8"
            ],
            "no password, no pwfile"
        );
        assert_eq!(hba_line(&st), "host all all all trust\n");
        assert_eq!(
            create_database(&st).as_deref(),
            Some("CREATE DATABASE \"we\"\"ird\";\n")
        );
    }

    #[test]
    fn file_forms_are_read_and_conflicts_and_unsupported_options_refused() {
        let read = |p: &Path| {
            assert_eq!(p, Path::new("/run/secrets/pw"));
            Ok("from-file\n".to_owned())
        };
        let st = settings(&env(&[("POSTGRES_PASSWORD_FILE", "/run/secrets/pw")]), read).unwrap();
        assert_eq!(st.password.as_deref(), Some("from-file"));
        assert!(matches!(
            settings(
                &env(&[("POSTGRES_PASSWORD", "a"), ("POSTGRES_PASSWORD_FILE", "/x")]),
                no_files
            ),
            Err(EntrypointError::Both(v)) if v == "POSTGRES_PASSWORD"
        ));
        assert!(matches!(
            settings(&env(&[("POSTGRES_USER_FILE", "/missing")]), no_files),
            Err(EntrypointError::ReadFile { .. })
        ));
        assert!(matches!(
            settings(&env(&[("POSTGRES_INITDB_WALDIR", "/wal")]), no_files),
            Err(EntrypointError::Unsupported(_))
        ));
    }

    #[test]
    fn arguments_choose_the_server_or_another_command() {
        assert_eq!(start_of(&[]), Start::Server(vec![]));
        assert_eq!(start_of(&s(&["postgres"])), Start::Server(vec![]));
        assert_eq!(
            start_of(&s(&["postgres", "-c", "fsync=off"])),
            Start::Server(s(&["-c", "fsync=off"]))
        );
        assert_eq!(
            start_of(&s(&["-c", "fsync=off"])),
            Start::Server(s(&["-c", "fsync=off"]))
        );
        assert_eq!(
            start_of(&s(&["psql", "--version"])),
            Start::Other(s(&["psql", "--version"]))
        );
    }
}
