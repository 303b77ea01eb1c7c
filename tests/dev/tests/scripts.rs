//! The CI scripts' own logic, run by bash as CI runs it (`set -euo pipefail`): a script that
//! fails for a reason of its own hides the test failures it was about to print.

use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `failure_summary` of tests/run-tests.sh on `log` and returns (exit status, stdout).
fn failure_summary(log: &std::path::Path) -> (i32, String) {
    let script = repo().join("tests/run-tests.sh");
    let out = Command::new("bash")
        .arg("-c")
        .arg(
            r#"set -euo pipefail
source <(sed -n '/^failure_summary()/,/^}/p' "$1")
declare -F failure_summary >/dev/null
failure_summary "$2"
echo END"#,
        )
        .arg("bash")
        .arg(&script)
        .arg(log)
        .output()
        .expect("bash runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn a_long_failure_summary_is_cut_without_failing_the_script() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("x.log");
    // Far more than a pipe's buffer after the marker: a reader that stops early gets the
    // writer killed by SIGPIPE.
    let mut text = String::from("running 2 tests\nfailures:\n");
    for i in 0..200_000 {
        text.push_str(&format!("line {i}\n"));
    }
    std::fs::write(&log, text).unwrap();
    let (code, out) = failure_summary(&log);
    assert_eq!(code, 0, "the summary must not fail the script: {out:.200}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 301, "300 lines of summary and END");
    assert_eq!(lines[0], "failures:");
    assert_eq!(lines[300], "END");
}

#[test]
fn a_log_without_a_harness_summary_shows_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("x.log");
    let text: String = (0..100).map(|i| format!("line {i}\n")).collect();
    std::fs::write(&log, text).unwrap();
    let (code, out) = failure_summary(&log);
    assert_eq!(code, 0);
    assert!(out.starts_with("line 40\n"), "{out}");
    assert!(out.ends_with("line 99\nEND\n"), "{out}");
    // A missing log (the binary never ran) is reported as nothing, not as a script failure.
    let (code, out) = failure_summary(&dir.path().join("missing.log"));
    assert_eq!((code, out.as_str()), (0, "END\n"));
}
