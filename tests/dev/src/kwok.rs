//! What kwok's kubelet API serves for the simulated workers' pods (`kubectl logs`, `exec`,
//! `attach`, `port-forward` on the host, and through a tenant's syncer).
//!
//! kwok answers the host apiserver's kubelet calls from configuration ([`debugging`]): a pod's
//! container log is a file under `<state>/kwok/` in the CRI log format (one per container name
//! below, a default for every other name, with a previous instance for `--previous`); `exec`
//! runs the command on this machine in `<state>/kwok/exec` (the workers run nothing, so there
//! is no container to enter: a dev cluster's tenants are its developer); `attach` follows the
//! `follow` log; `port-forward` to any port is an echo (`cat`). Tests append to the `follow`
//! log ([`append_log`]) to see lines arrive.

use crate::{Error, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The folder under a dev cluster's state directory.
pub const DIR: &str = "kwok";

/// Lines of the default container log (any container name but those below).
pub const APP_LINES: [&str; 5] = [
    "app line 1",
    "app line 2",
    "app line 3",
    "app line 4",
    "app line 5",
];
/// Lines of the previous instance of the default container (`--previous`).
pub const PREVIOUS_LINES: [&str; 2] = ["app previous 1", "app previous 2"];
/// Lines of a container named `side`.
pub const SIDE_LINES: [&str; 2] = ["side line 1", "side line 2"];
/// A container named this logs what [`append_log`] adds (and `attach` shows it).
pub const FOLLOW_CONTAINER: &str = "follow";

/// The log file kwok serves for the container `follow` (and for `attach`).
pub fn follow_log(state_dir: &Path) -> PathBuf {
    state_dir.join(DIR).join("follow.log")
}

/// One line in the CRI log format kwok reads (`<time> stdout F <line>`).
fn cri_line(line: &str) -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    format!("{now} stdout F {line}\n")
}

/// Appends `line` to the log at `path`.
pub fn append_log(path: &Path, line: &str) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map_err(Error::io(path))?;
    f.write_all(cri_line(line).as_bytes())
        .map_err(Error::io(path))
}

/// Writes the log files under `dir` (kept if there) and returns kwok's configuration for
/// logs, attach, exec and port-forward of every pod it simulates (YAML documents).
pub fn debugging(dir: &Path) -> Result<String> {
    let exec = dir.join("exec");
    std::fs::create_dir_all(&exec).map_err(Error::io(&exec))?;
    let file = |name: &str, lines: &[&str]| -> Result<String> {
        let path = dir.join(name);
        if !path.exists() {
            let text: String = lines.iter().map(|l| cri_line(l)).collect();
            std::fs::write(&path, text).map_err(Error::io(&path))?;
        }
        Ok(path.to_string_lossy().into_owned())
    };
    let app = file("app.log", &APP_LINES)?;
    let previous = file("app-previous.log", &PREVIOUS_LINES)?;
    let side = file("side.log", &SIDE_LINES)?;
    let follow = file("follow.log", &["follow line 0"])?;
    let exec = exec.to_string_lossy();
    Ok(format!(
        r#"apiVersion: kwok.x-k8s.io/v1alpha1
kind: ClusterLogs
metadata:
  name: vcp-dev-logs
spec:
  logs:
  - containers: [side]
    logsFile: {side:?}
    follow: true
  - containers: [{FOLLOW_CONTAINER}]
    logsFile: {follow:?}
    follow: true
  - logsFile: {app:?}
    previousLogsFile: {previous:?}
    follow: true
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: ClusterAttach
metadata:
  name: vcp-dev-attach
spec:
  attaches:
  - logsFile: {follow:?}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: ClusterExec
metadata:
  name: vcp-dev-exec
spec:
  execs:
  - local:
      workDir: {exec:?}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: ClusterPortForward
metadata:
  name: vcp-dev-port-forward
spec:
  forwards:
  - command: [cat]
"#
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[test]
    fn the_configuration_names_every_file_and_keeps_existing_logs() {
        let dir = tempfile::tempdir().unwrap();
        let yaml = debugging(dir.path()).unwrap();
        for kind in [
            "ClusterLogs",
            "ClusterAttach",
            "ClusterExec",
            "ClusterPortForward",
        ] {
            assert!(yaml.contains(&format!("kind: {kind}")), "{kind}");
        }
        let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&yaml)
            .map(|d| serde_yaml::Value::deserialize(d).unwrap())
            .collect();
        assert_eq!(docs.len(), 4);
        let app = std::fs::read_to_string(dir.path().join("app.log")).unwrap();
        assert_eq!(app.lines().count(), APP_LINES.len());
        assert!(
            app.lines().all(|l| l.contains(" stdout F app line ")),
            "{app}"
        );
        append_log(&dir.path().join("follow.log"), "more").unwrap();
        debugging(dir.path()).unwrap();
        let follow = std::fs::read_to_string(dir.path().join("follow.log")).unwrap();
        assert!(follow.ends_with(" stdout F more\n"), "{follow}");
    }
}
