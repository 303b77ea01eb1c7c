//! Starting and stopping the cluster's processes.
//!
//! Every component runs in its own process group, so stopping it also stops anything it
//! forked. Two supervision modes:
//! - `Detached` (`vcp-dev up`): processes outlive the command that started them; `down` finds
//!   them again through the pids in the state dir.
//! - `Attached` (the library, in tests): processes die with the process that started them,
//!   even on SIGKILL of a test binary, because they are started through `setpriv --pdeathsig`
//!   from one long-lived spawner thread (the parent-death signal fires when the *thread* that
//!   forked exits, so short-lived test threads must not be the ones that fork).
//!
//! Liveness is read from /proc, where a zombie counts as dead: the sandbox's PID 1 may not
//! reap orphans promptly.

use crate::{Error, Result};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

/// How started processes relate to the starter's lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Supervision {
    Detached,
    Attached,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct ProcSpec {
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    /// Run as this user (via setpriv) when we are root; postgres refuses to run as root.
    pub run_as: Option<String>,
    /// Start from an empty environment (containers get exactly their pod's env).
    pub clear_env: bool,
    /// Signal an attached process gets when its starter dies: KILL by default; TERM for a
    /// process that must clean up after itself (the devnode removes its network).
    pub parent_death_signal: &'static str,
}

impl ProcSpec {
    pub fn new(name: &str, program: impl Into<PathBuf>) -> Self {
        ProcSpec {
            name: name.to_owned(),
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            cwd: None,
            run_as: None,
            clear_env: false,
            parent_death_signal: "KILL",
        }
    }

    pub fn arg(mut self, a: impl Into<String>) -> Self {
        self.args.push(a.into());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, a: I) -> Self {
        self.args.extend(a.into_iter().map(Into::into));
        self
    }

    fn command(&self, mode: Supervision, log: &Path) -> Result<Command> {
        let wrap = mode == Supervision::Attached || (self.run_as.is_some() && is_root());
        let mut cmd = if wrap {
            let mut c = Command::new("setpriv");
            if let Some(user) = self.run_as.as_deref().filter(|_| is_root()) {
                c.args(["--reuid", user, "--regid", user, "--init-groups"]);
            }
            if mode == Supervision::Attached {
                c.args(["--pdeathsig", self.parent_death_signal]);
            }
            c.arg("--").arg(&self.program);
            c
        } else {
            Command::new(&self.program)
        };
        if self.clear_env {
            cmd.env_clear();
        }
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .process_group(0);
        if let Some(cwd) = &self.cwd {
            cmd.current_dir(cwd);
        }
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .map_err(Error::io(log))?;
        let err = out.try_clone().map_err(Error::io(log))?;
        cmd.stdout(out).stderr(err);
        Ok(cmd)
    }
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A started process. It is stopped when dropped unless [`Spawned::release`]d, so a startup
/// that fails half-way leaves nothing behind. In attached mode it keeps the `Child` to reap it.
#[derive(Debug)]
pub struct Spawned {
    pub name: String,
    pub pid: u32,
    pub log: PathBuf,
    /// The program's canonical path, as /proc/<pid>/exe will show it.
    pub exe: PathBuf,
    child: Option<Child>,
    armed: bool,
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// The one thread that forks attached processes; it lives as long as the process.
fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("vcp-dev-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("failed to start the spawner thread");
        Mutex::new(tx)
    })
}

/// Starts a process, logging its output to `log` (appended).
pub fn spawn(spec: &ProcSpec, mode: Supervision, log: &Path) -> Result<Spawned> {
    let mut cmd = spec.command(mode, log)?;
    let spawn_err = |source| Error::Spawn {
        component: spec.name.clone(),
        source,
    };
    let child = match mode {
        Supervision::Detached => cmd.spawn().map_err(spawn_err)?,
        Supervision::Attached => {
            let (tx, rx) = mpsc::channel();
            spawner()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .send((cmd, tx))
                .expect("the spawner thread never exits");
            rx.recv()
                .expect("the spawner always replies")
                .map_err(spawn_err)?
        }
    };
    tracing::debug!(component = %spec.name, pid = child.id(), "started");
    Ok(Spawned {
        name: spec.name.clone(),
        pid: child.id(),
        log: log.to_owned(),
        exe: std::fs::canonicalize(&spec.program).unwrap_or_else(|_| spec.program.clone()),
        child: (mode == Supervision::Attached).then_some(child),
        armed: true,
    })
}

impl Spawned {
    /// Fails with the end of the log if the process has already exited.
    pub fn check_running(&mut self) -> Result<()> {
        let status = match &mut self.child {
            Some(child) => child
                .try_wait()
                .map_err(Error::io(&self.log))?
                .map(|s| s.to_string()),
            None => (!pid_alive(self.pid)).then(|| "exited".to_owned()),
        };
        match status {
            None => Ok(()),
            Some(status) => Err(Error::Exited {
                component: self.name.clone(),
                status,
                log: self.log.clone(),
                tail: log_tail(&self.log, 15),
            }),
        }
    }

    /// Stops the process group: SIGTERM, then SIGKILL after `grace`; reaps attached children.
    pub fn stop(&mut self, grace: Duration) {
        self.armed = false;
        stop_group(self.pid, grace);
        if let Some(child) = &mut self.child {
            let _ = child.wait();
        }
    }

    /// The exit status, if the (attached) process has exited; reaps it.
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// [`Spawned::stop`], then the exit status (attached processes).
    pub fn stop_and_wait(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        self.stop(grace);
        self.try_wait()
    }

    /// Lets the process outlive this handle (detached mode, after a successful start).
    pub fn release(mut self) {
        self.armed = false;
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if self.armed {
            self.stop(Duration::from_secs(5));
        }
    }
}

/// What a failed run needs to be understood afterwards (a benchmark's error, say): each
/// process alive or not, the end of each log, and the disk space left where the logs are
/// (a full disk stops etcd, which the apiserver reports only as an `EOF` from etcd).
pub fn postmortem(procs: &[Spawned], lines: usize) -> String {
    let mut out = String::new();
    for p in procs {
        let state = if pid_alive(p.pid) {
            "running"
        } else {
            "EXITED"
        };
        out.push_str(&format!(
            "--- {} (pid {}, {state}), {}:\n{}\n",
            p.name,
            p.pid,
            p.log.display(),
            log_tail(&p.log, lines)
        ));
    }
    if let Some(dir) = procs.first().and_then(|p| p.log.parent()) {
        out.push_str(&format!("--- disk: {}\n", disk_free(dir)));
    }
    out
}

/// Free space of the file system holding `dir`, as `df` tells it (or why it could not).
fn disk_free(dir: &Path) -> String {
    match std::process::Command::new("df").arg("-h").arg(dir).output() {
        Ok(o) => String::from_utf8_lossy(&o.stdout)
            .lines()
            .nth(1)
            .unwrap_or("?")
            .to_owned(),
        Err(e) => format!("df: {e}"),
    }
}

/// The last `n` lines of a log file (for error messages).
pub fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// State letter and process group of a pid, from /proc/<pid>/stat.
fn proc_stat(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces; fields follow the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let pgrp = fields.nth(1)?.parse().ok()?;
    Some((state, pgrp))
}

/// Whether a process exists and is not a zombie.
pub fn pid_alive(pid: u32) -> bool {
    matches!(proc_stat(pid), Some((s, _)) if s != 'Z' && s != 'X')
}

/// Live (non-zombie) members of a process group.
pub fn group_members(pgid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| matches!(proc_stat(*pid), Some((s, g)) if g == pgid && s != 'Z' && s != 'X'))
        .collect()
}

/// Whether `pid` is alive and runs `exe` (guards against a recycled pid). A binary replaced
/// on disk since it started (a rebuilt vcp-dev) still counts.
pub fn runs(pid: u32, exe: &Path) -> bool {
    pid_alive(pid)
        && std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|p| {
            let p = p.to_string_lossy();
            p.strip_suffix(" (deleted)").unwrap_or(&p) == exe.to_string_lossy()
        })
}

/// SIGTERM to a process group, SIGKILL to what is left after `grace`. Returns when the group
/// has no live members (or after a further second of SIGKILL).
pub fn stop_group(pgid: u32, grace: Duration) {
    let pg = Pid::from_raw(pgid as i32);
    if group_members(pgid).is_empty() {
        return;
    }
    let _ = killpg(pg, Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if group_members(pgid).is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = killpg(pg, Signal::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline && !group_members(pgid).is_empty() {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `n` distinct free TCP ports on 127.0.0.1, for components that need their port on the command
/// line. The ports are released before use, so they are taken below the kernel's ephemeral range
/// (and below the NodePort range): a port the kernel handed out with port 0 is soon reused as the
/// source port of some outgoing connection, which made a component's bind fail now and then.
/// A port is handed out once per machine while its process lives: within this process through
/// `GIVEN`, and between processes through a claim on the shared lock file (see `claim`). The
/// bind check alone left a window between the check and the component's bind in which another
/// test binary picked the same port (etcd's peer port "address already in use" in CI).
pub fn free_ports<const N: usize>() -> Result<[u16; N]> {
    use std::hash::{BuildHasher, Hasher};
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let (low, high) = port_pool();
    let span = u32::from(high - low);
    if span < 1000 {
        return os_ports();
    }
    let mut seed = std::collections::hash_map::RandomState::new().build_hasher();
    seed.write_u32(std::process::id());
    let mut next = (seed.finish() % u64::from(span)) as u32;
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut ports = [0; N];
    let mut found = 0;
    for _ in 0..span {
        if found == N {
            break;
        }
        let port = low + (next % span) as u16;
        // A stride coprime with the span visits every port once, far apart from the last pick.
        next = next.wrapping_add(7919);
        if given.contains(&port)
            || std::net::TcpListener::bind(("127.0.0.1", port)).is_err()
            || !claim(port)
        {
            continue;
        }
        given.push(port);
        ports[found] = port;
        found += 1;
    }
    if found < N {
        return Err(Error::io("127.0.0.1")(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!("no free port left in {low}..{high}"),
        )));
    }
    Ok(ports)
}

/// The file whose bytes stand for the pool's ports: byte `p` locked means port `p` was handed
/// out to a process that still runs. Open file description locks (not POSIX record locks) so
/// that a lock taken through a second open of the file conflicts even within one process, and
/// so that no other close in this process drops them; the kernel releases them when the
/// process exits, however it exits. The descriptor is close-on-exec, so children never hold it.
fn claims() -> Option<&'static File> {
    static FILE: OnceLock<Option<File>> = OnceLock::new();
    FILE.get_or_init(|| {
        use std::os::unix::fs::OpenOptionsExt;
        let path = claims_path();
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .open(&path)
        {
            Ok(f) => Some(f),
            Err(e) => {
                eprintln!(
                    "vcp-dev: port claims off ({}: {e}); ports are only checked by binding",
                    path.display()
                );
                None
            }
        }
    })
    .as_ref()
}

fn claims_path() -> PathBuf {
    std::env::temp_dir().join("vcp-dev-ports.lock")
}

/// Claims `port` for this process: false when another process holds it. A kernel without
/// open file description locks leaves only the bind check.
fn claim(port: u16) -> bool {
    let Some(file) = claims() else { return true };
    match lock_byte(file, port) {
        Ok(()) => true,
        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => false,
        Err(_) => true,
    }
}

fn lock_byte(file: &File, port: u16) -> nix::Result<()> {
    use nix::fcntl::{FcntlArg, fcntl};
    use nix::libc;
    let range = libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: libc::off_t::from(port),
        l_len: 1,
        l_pid: 0,
    };
    fcntl(file, FcntlArg::F_OFD_SETLK(&range)).map(drop)
}

/// Ports the kernel picks, for a machine whose ephemeral range leaves no room below it.
fn os_ports<const N: usize>() -> Result<[u16; N]> {
    let listeners = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").map_err(Error::io("127.0.0.1:0")))
        .collect::<Result<Vec<_>>>()?;
    let mut ports = [0; N];
    for (port, l) in ports.iter_mut().zip(&listeners) {
        *port = l.local_addr().map_err(Error::io("127.0.0.1:0"))?.port();
    }
    Ok(ports)
}

/// The ports `free_ports` picks from: 20000..30000 when that lies below the kernel's ephemeral
/// range, else the 10,000 ports just below that range.
fn port_pool() -> (u16, u16) {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let high = ephemeral_low.min(30000);
    (high.saturating_sub(10000).max(1024), high)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Taken by every test here that binds ports of the pool: one of them holds all but ten
    /// for a moment, and a port another test had just been handed was then taken from under
    /// it (2 failures in 30 runs of the two side by side).
    static POOL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn free_ports_are_distinct_bindable_and_outside_the_ephemeral_range() {
        let _pool = POOL
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (low, high) = port_pool();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..50 {
            let ports: [u16; 4] = free_ports().unwrap();
            for p in ports {
                assert!((low..high).contains(&p), "{p} outside {low}..{high}");
                assert!(seen.insert(p), "{p} handed out twice");
                std::net::TcpListener::bind(("127.0.0.1", p)).unwrap();
            }
        }
    }

    #[test]
    fn a_port_claimed_elsewhere_is_never_handed_out() {
        let _pool = POOL
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (low, high) = port_pool();
        claims().expect("the claims file opens");
        // A second open of the claims file is another claimant, as another process would be.
        let other = File::options()
            .read(true)
            .write(true)
            .open(claims_path())
            .unwrap();
        let claimed: Vec<u16> = (low..high)
            .step_by(2)
            .filter(|&p| lock_byte(&other, p).is_ok())
            .collect();
        assert!(
            claimed.len() > 4000,
            "only {} ports claimable",
            claimed.len()
        );
        for _ in 0..20 {
            let ports: [u16; 5] = free_ports().unwrap();
            for p in ports {
                assert!(
                    claimed.binary_search(&p).is_err(),
                    "{p} was handed out although another claimant holds it"
                );
            }
        }
        drop(other);
    }

    /// Run only as the child of `a_port_stays_claimed_while_its_process_lives`.
    #[test]
    fn port_claim_child() {
        if std::env::var_os("VCP_DEV_PORT_CLAIM_CHILD").is_none() {
            return;
        }
        let ports: [u16; 8] = free_ports().unwrap();
        println!("ports={}", ports.map(|p| p.to_string()).join(","));
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).unwrap();
    }

    #[test]
    fn a_port_stays_claimed_while_its_process_lives() {
        use std::io::{BufRead, Write};
        // Without it, a test beside this one could be handed a port the child just released,
        // and that port then reads as still claimed (CI on 093b5f3).
        let _pool = POOL
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "process::tests::port_claim_child", "--nocapture"])
            .env("VCP_DEV_PORT_CLAIM_CHILD", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let ports: Vec<u16> = loop {
            let mut line = String::new();
            assert_ne!(
                out.read_line(&mut line).unwrap(),
                0,
                "the child printed no ports"
            );
            if let Some(list) = line.trim().strip_prefix("ports=") {
                break list.split(',').map(|p| p.parse().unwrap()).collect();
            }
        };
        let mine = File::options()
            .read(true)
            .write(true)
            .open(claims_path())
            .unwrap();
        for &p in &ports {
            assert!(
                lock_byte(&mine, p).is_err(),
                "{p}, handed to a live process, is not claimed"
            );
        }
        writeln!(child.stdin.take().unwrap()).unwrap();
        assert!(child.wait().unwrap().success());
        for &p in &ports {
            assert!(
                lock_byte(&mine, p).is_ok(),
                "{p} is still claimed after its process exited"
            );
        }
    }

    #[test]
    fn a_bound_port_is_never_handed_out() {
        let _pool = POOL
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (low, high) = port_pool();
        // Hold every port of the pool but ten; the ten free ones are all that can come back.
        let held: Vec<_> = (low..high - 10)
            .filter_map(|p| std::net::TcpListener::bind(("127.0.0.1", p)).ok())
            .collect();
        let ports: [u16; 5] = free_ports().unwrap();
        for p in ports {
            assert!(p >= high - 10 || !held.iter().any(|l| l.local_addr().unwrap().port() == p));
        }
        drop(held);
    }
}
