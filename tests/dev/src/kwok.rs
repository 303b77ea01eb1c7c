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
//!
//! kwok also serves each simulated node's resource metrics ([`metrics`]) at the path the
//! node's `metrics.k8s.io/resource-metrics-path` annotation names, which metrics-server scrapes
//! as it scrapes a kubelet's `/metrics/resource`: every container uses [`IDLE_USAGE`], one
//! named [`BUSY_CONTAINER`] uses [`BUSY_USAGE`].

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

/// A container named this uses [`BUSY_USAGE`]; every other [`IDLE_USAGE`].
pub const BUSY_CONTAINER: &str = "busy";
/// CPU and memory of a [`BUSY_CONTAINER`], as kwok simulates them.
pub const BUSY_USAGE: (&str, &str) = ("250m", "64Mi");
/// CPU and memory of every other container.
pub const IDLE_USAGE: (&str, &str) = ("2m", "3Mi");

/// The path kwok serves node `name`'s resource metrics at.
pub fn resource_metrics_path(name: &str) -> String {
    format!("/metrics/nodes/{name}/metrics/resource")
}

/// kwok's configuration for simulated resource usage and the resource-metrics endpoint
/// metrics-server reads (YAML documents): the cumulative CPU counters and working sets of
/// containers, pods and nodes, as a kubelet's `/metrics/resource` has them.
pub fn metrics() -> String {
    let (busy_cpu, busy_mem) = BUSY_USAGE;
    let (idle_cpu, idle_mem) = IDLE_USAGE;
    let container = "[{name: container, value: container.name}, {name: namespace, value: pod.metadata.namespace}, {name: pod, value: pod.metadata.name}]";
    let pod =
        "[{name: namespace, value: pod.metadata.namespace}, {name: pod, value: pod.metadata.name}]";
    format!(
        r#"apiVersion: kwok.x-k8s.io/v1alpha1
kind: ClusterResourceUsage
metadata:
  name: vcp-dev-usage
spec:
  usages:
  - containers: [{BUSY_CONTAINER}]
    usage:
      cpu: {{value: "{busy_cpu}"}}
      memory: {{value: "{busy_mem}"}}
  - usage:
      cpu: {{value: "{idle_cpu}"}}
      memory: {{value: "{idle_mem}"}}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Metric
metadata:
  name: vcp-dev-resource-metrics
spec:
  path: "{path}"
  metrics:
  - {{name: scrape_error, dimension: node, kind: gauge, value: "0"}}
  - {{name: container_start_time_seconds, dimension: container, kind: gauge, labels: {container}, value: "pod.SinceSecond()"}}
  - {{name: container_cpu_usage_seconds_total, dimension: container, kind: counter, labels: {container}, value: 'pod.CumulativeUsage("cpu", container.name)'}}
  - {{name: container_memory_working_set_bytes, dimension: container, kind: gauge, labels: {container}, value: 'pod.Usage("memory", container.name)'}}
  - {{name: pod_cpu_usage_seconds_total, dimension: pod, kind: counter, labels: {pod}, value: 'pod.CumulativeUsage("cpu")'}}
  - {{name: pod_memory_working_set_bytes, dimension: pod, kind: gauge, labels: {pod}, value: 'pod.Usage("memory")'}}
  - {{name: node_cpu_usage_seconds_total, dimension: node, kind: counter, value: 'node.CumulativeUsage("cpu")'}}
  - {{name: node_memory_working_set_bytes, dimension: node, kind: gauge, value: 'node.Usage("memory")'}}
"#,
        path = resource_metrics_path("{nodeName}"),
    )
}

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

    #[test]
    fn the_metrics_configuration_is_two_documents_with_usage_per_container() {
        let yaml = metrics();
        let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&yaml)
            .map(|d| serde_yaml::Value::deserialize(d).unwrap())
            .collect();
        let kinds: Vec<_> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["ClusterResourceUsage", "Metric"]);
        let usages = &docs[0]["spec"]["usages"];
        assert_eq!(usages[0]["containers"][0].as_str(), Some(BUSY_CONTAINER));
        assert_eq!(
            usages[0]["usage"]["cpu"]["value"].as_str(),
            Some(BUSY_USAGE.0)
        );
        assert_eq!(
            usages[1]["usage"]["memory"]["value"].as_str(),
            Some(IDLE_USAGE.1)
        );
        assert_eq!(
            docs[1]["spec"]["path"].as_str(),
            Some("/metrics/nodes/{nodeName}/metrics/resource")
        );
        let names: Vec<_> = docs[1]["spec"]["metrics"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap())
            .collect();
        for wanted in [
            "container_cpu_usage_seconds_total",
            "container_memory_working_set_bytes",
            "node_cpu_usage_seconds_total",
        ] {
            assert!(names.contains(&wanted), "{wanted} in {names:?}");
        }
    }
}
