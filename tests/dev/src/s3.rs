//! A real S3-compatible server for the dev cluster's backups: `s3s-fs` (Apache-2.0; objects are
//! files under a directory), built from crates.io by `tests/setup.sh` into the binary cache
//! ([`binary`]), never downloaded prebuilt.
//!
//! It listens on the devnode's gateway address (the host side of the pod bridge), not on
//! 127.0.0.1: the snapshot Jobs run in pods' network namespaces, where 127.0.0.1 is the pod's
//! own loopback and the gateway is the node's address, while host processes (`vcp serve`, the
//! tests) reach the gateway as a local address too. Nothing outside the machine can: the
//! bridge is one the devnode created. Its data is `<state>/s3/data/<bucket>/...`, its
//! credentials are generated once per state dir and kept in a file only its owner reads.

use crate::process::{self, ProcSpec, Spawned, Supervision};
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The crate and version `tests/setup.sh` installs (`cargo install --locked`).
pub const CRATE: &str = "s3s-fs";
pub const VERSION: &str = "0.14.1";
/// The bucket the dev cluster makes.
pub const BUCKET: &str = "vcp-backups";

/// Where the cached binary is: `<bin dir>/s3s-fs-<version>`.
pub fn binary() -> Result<PathBuf> {
    crate::bins::binary(CRATE, VERSION).map_err(|_| {
        Error::InvalidOption(format!(
            "{CRATE} {VERSION} is not built: run tests/setup.sh (it builds {CRATE} from crates.io into {})",
            crate::bins::bin_dir().display()
        ))
    })
}

/// What `state.json` records of the server: enough for `vcp serve --backup-store` and tests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct S3Record {
    pub endpoint: String,
    pub bucket: String,
    /// `access key id` and `secret access key`, one per line (mode 0600).
    pub credentials: PathBuf,
}

impl S3Record {
    /// (access key id, secret access key).
    pub fn credentials(&self) -> Result<(String, String)> {
        let text =
            std::fs::read_to_string(&self.credentials).map_err(Error::io(&self.credentials))?;
        let mut lines = text.lines();
        match (lines.next(), lines.next()) {
            (Some(a), Some(s)) => Ok((a.to_owned(), s.to_owned())),
            _ => Err(Error::InvalidOption(format!(
                "{} does not hold two lines",
                self.credentials.display()
            ))),
        }
    }

    /// A `vcp serve --backup-store` file's text for objects under `prefix`.
    pub fn store_file(&self, prefix: &str) -> String {
        format!(
            "endpoint: {}\nbucket: {}\nprefix: {prefix}\nregion: us-east-1\n",
            self.endpoint, self.bucket
        )
    }
}

/// Starts the server in `dir` on `host`, with the bucket made, and waits until it answers.
pub async fn start_in(
    dir: &Path,
    host: Ipv4Addr,
    log: &Path,
    mode: Supervision,
) -> Result<(S3Record, Spawned)> {
    let exe = binary()?;
    let data = dir.join("data");
    std::fs::create_dir_all(data.join(BUCKET)).map_err(Error::io(&data))?;
    let credentials = dir.join("credentials");
    if !credentials.exists() {
        let text = format!("{}\n{}\n", crate::pki::new_token(), crate::pki::new_token());
        crate::cluster::write_secret_file(&credentials, &text)?;
    }
    let [port] = process::free_ports()?;
    let mut record = S3Record {
        endpoint: format!("http://{host}:{port}"),
        bucket: BUCKET.to_owned(),
        credentials,
    };
    let (access, secret) = record.credentials()?;
    let spec = ProcSpec::new("s3", &exe).args([
        format!("--host={host}"),
        format!("--port={port}"),
        format!("--access-key={access}"),
        format!("--secret-key={secret}"),
        data.to_string_lossy().into_owned(),
    ]);
    let mut proc = process::spawn(&spec, mode, log)?;
    // Any HTTP answer (403 to an unsigned request) means it serves.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .map_err(|e| Error::InvalidOption(format!("http client: {e}")))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        proc.check_running()?;
        if http.get(&record.endpoint).send().await.is_ok() {
            break;
        }
        if Instant::now() > deadline {
            proc.stop(Duration::ZERO);
            return Err(Error::Unhealthy {
                component: "s3".into(),
                secs: 30,
                log: log.to_owned(),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    record.endpoint = record.endpoint.trim_end_matches('/').to_owned();
    Ok((record, proc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_file_names_endpoint_bucket_and_prefix() {
        let r = S3Record {
            endpoint: "http://10.245.3.1:4000".into(),
            bucket: BUCKET.into(),
            credentials: "/x".into(),
        };
        let text = r.store_file("backup-test");
        assert!(
            text.contains("endpoint: http://10.245.3.1:4000\n"),
            "{text}"
        );
        assert!(text.contains("bucket: vcp-backups\n") && text.contains("prefix: backup-test\n"));
    }
}
