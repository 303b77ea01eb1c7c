//! `vcp tool etcd-export` and `vcp tool etcd-import`: a tenant's keys copied out of etcd into a
//! logical snapshot ([`super::logical`]) and back, through etcd's JSON gateway, as the tenant's
//! own etcd user on a shared datastore (by its password) or with the apiserver's certificate on
//! a dedicated etcd (no authentication there).
//!
//! - Export reads the tenant's range `[<prefix>/, <prefix>0)` at one revision, paged, with the
//!   time left on each key's lease, into a `.part` file renamed when whole, and prints a
//!   [`Report`] (storage version [`logical::FORMAT`]) to the termination-message file. A page
//!   that etcd compacted away under it starts the export again at a newer revision.
//! - Import checks the file's SHA-256 against what the inventory recorded and reads it through
//!   once (count and lines) before it deletes anything; then it deletes the range and puts the
//!   keys back under its own prefix in transactions ([`logical::batches`]), keys with a lease on
//!   new leases of about their time left. Run again after a crash it does the same again, so a
//!   Job's retry finishes what a killed attempt left.

use super::logical::{self, Entry, Item, Reader};
use crate::etcd::{EtcdConnection, Gateway, b64, int, unb64};
use crate::render::datastore::prefix_range;
use crate::snapshots::Report;
use crate::{Error, Result};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};

/// Keys per page of an export.
const PAGE: usize = 500;

fn fail(m: impl Into<String>) -> Error {
    Error::Snapshot(m.into())
}

fn io(p: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| fail(format!("{}: {e}", p.display()))
}

/// Who the commands are to etcd besides their certificate.
#[derive(Debug, clap::Args)]
pub struct Login {
    /// The etcd user to authenticate as (a shared datastore's tenant user); none on a
    /// dedicated etcd, which runs without authentication.
    #[arg(long, env = "VCP_ETCD_USER", requires = "password_file")]
    pub user: Option<String>,
    /// A file holding that user's password.
    #[arg(long, env = "VCP_ETCD_PASSWORD_FILE", requires = "user")]
    pub password_file: Option<PathBuf>,
}

impl Login {
    async fn token(&self, gw: &Gateway) -> Result<Option<String>> {
        match (&self.user, &self.password_file) {
            (Some(user), Some(file)) => {
                let password = crate::etcd::read_password(file)?;
                Ok(Some(gw.authenticate(user, &password).await?))
            }
            _ => Ok(None),
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    #[command(flatten)]
    pub etcd: EtcdConnection,
    #[command(flatten)]
    pub login: Login,
    /// The apiserver's `--etcd-prefix` (`/registry` on a dedicated etcd).
    #[arg(long, env = "VCP_ETCD_PREFIX")]
    pub prefix: String,
    /// The file to write (atomically: a `.part` file renamed when complete).
    #[arg(long, env = "VCP_SNAPSHOT_FILE")]
    pub out: PathBuf,
    /// Where the report goes besides stdout: the container's termination-message file.
    #[arg(
        long,
        env = "VCP_SNAPSHOT_REPORT",
        default_value = "/dev/termination-log"
    )]
    pub report: PathBuf,
}

#[derive(Debug, clap::Args)]
pub struct ImportArgs {
    #[command(flatten)]
    pub etcd: EtcdConnection,
    #[command(flatten)]
    pub login: Login,
    /// The prefix the keys go under (the restored apiserver's `--etcd-prefix`).
    #[arg(long, env = "VCP_ETCD_PREFIX")]
    pub prefix: String,
    /// The logical snapshot file.
    #[arg(long, env = "VCP_SNAPSHOT_FILE")]
    pub snapshot: PathBuf,
    /// Its SHA-256 as the inventory recorded it, hex.
    #[arg(long, env = "VCP_SNAPSHOT_SHA256")]
    pub sha256: String,
}

/// A prefix an apiserver could have: absolute, no trailing slash.
fn check_prefix(prefix: &str) -> Result<()> {
    if !prefix.starts_with('/') || prefix.ends_with('/') || prefix.len() < 2 {
        return Err(fail(format!(
            "prefix {prefix:?}: an absolute key prefix without a trailing slash is needed"
        )));
    }
    Ok(())
}

/// Exports the tenant's keys and writes the report where the pass reads it.
pub async fn export_command(a: &ExportArgs) -> Result<()> {
    check_prefix(&a.prefix)?;
    let gw = a.etcd.gateway()?;
    let token = a.login.token(&gw).await?;
    let mut attempt = 0;
    let r = loop {
        attempt += 1;
        match export(&gw, token.as_deref(), &a.prefix, &a.out).await {
            Err(e) if attempt < 3 && e.to_string().contains("compacted") => {
                tracing::warn!(error = %e, "etcd compacted the revision being read; exporting again");
            }
            r => break r?,
        }
    };
    let text = serde_json::to_string(&r).expect("a report encodes");
    println!("{text}");
    std::fs::write(&a.report, &text).map_err(io(&a.report))?;
    Ok(())
}

/// The keys under `prefix`, at one revision, into `out`.
pub async fn export(gw: &Gateway, token: Option<&str>, prefix: &str, out: &Path) -> Result<Report> {
    let (start, end) = prefix_range(prefix);
    let (start, end) = (start.into_bytes(), end.into_bytes());
    let first = gw
        .call(
            "/v3/kv/range",
            json!({"key": b64(&start), "range_end": b64(&end), "count_only": true}),
            token,
        )
        .await?;
    let revision = int(&first["header"]["revision"]);
    let count = u64::try_from(int(&first["count"])).unwrap_or(0);
    if revision <= 0 {
        return Err(fail(format!("etcd answered without a revision: {first}")));
    }
    let part = out.with_extension("part");
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let mut file = std::io::BufWriter::new(std::fs::File::create(&part).map_err(io(&part))?);
    let (mut hash, mut size) = (Sha256::new(), 0i64);
    let mut write = |text: &str| -> Result<()> {
        file.write_all(text.as_bytes()).map_err(io(&part))?;
        hash.update(text.as_bytes());
        size += text.len() as i64;
        Ok(())
    };
    write(&logical::header_line(revision, count))?;
    // The time left on each lease, asked once per lease (the apiserver shares its leases
    // among many keys).
    let mut leases: HashMap<i64, i64> = HashMap::new();
    let (mut cursor, mut found) = (start, 0u64);
    loop {
        let page = gw
            .call(
                "/v3/kv/range",
                json!({
                    "key": b64(&cursor),
                    "range_end": b64(&end),
                    "limit": PAGE,
                    "revision": revision,
                }),
                token,
            )
            .await?;
        let kvs = page["kvs"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        for kv in kvs {
            let key = unb64(&kv["key"])?;
            let rest = key
                .strip_prefix(prefix.as_bytes())
                .ok_or_else(|| fail("etcd returned a key outside the range asked for"))?;
            let lease = int(&kv["lease"]);
            let ttl = if lease == 0 {
                None
            } else {
                let left = match leases.get(&lease) {
                    Some(t) => *t,
                    None => {
                        let t = gw
                            .call(
                                "/v3/lease/timetolive",
                                json!({"ID": lease.to_string()}),
                                token,
                            )
                            .await?;
                        // -1: the lease expired since the revision; its keys are about to go.
                        let left = int(&t["TTL"]).max(0);
                        leases.insert(lease, left);
                        left
                    }
                };
                Some(left)
            };
            write(&logical::key_line(rest, &unb64(&kv["value"])?, ttl))?;
            found += 1;
            cursor = key;
        }
        if !page["more"].as_bool().unwrap_or(false) || kvs.is_empty() {
            break;
        }
        // The next page starts just after the last key read.
        cursor.push(0);
    }
    if found != count {
        return Err(fail(format!(
            "etcd counted {count} keys at revision {revision} but returned {found}"
        )));
    }
    let file = file
        .into_inner()
        .map_err(|e| fail(format!("{}: {e}", part.display())))?;
    file.sync_all().map_err(io(&part))?;
    drop(file);
    std::fs::rename(&part, out).map_err(io(out))?;
    Ok(Report {
        revision,
        size,
        sha256: hash.finalize().iter().map(|b| format!("{b:02x}")).collect(),
        storage_version: logical::FORMAT.into(),
        object: None,
        backup_key: None,
    })
}

/// A logical snapshot read line by line: its keys in order, then its header checked against
/// what was read.
struct FileReader<'a> {
    path: &'a Path,
    lines: std::io::Lines<std::io::BufReader<std::fs::File>>,
    reader: Reader,
}

impl<'a> FileReader<'a> {
    fn open(path: &'a Path) -> Result<FileReader<'a>> {
        let f = std::fs::File::open(path).map_err(io(path))?;
        Ok(FileReader {
            path,
            lines: std::io::BufReader::new(f).lines(),
            reader: Reader::default(),
        })
    }

    /// The next key; `None` at the end.
    fn next_key(&mut self) -> Result<Option<Entry>> {
        let path = self.path;
        let bad = |e: logical::LogicalError| fail(format!("{}: {e}", path.display()));
        for line in self.lines.by_ref() {
            let line = line.map_err(io(path))?;
            if let Item::Key(e) = self.reader.line(&line).map_err(bad)? {
                return Ok(Some(e));
            }
        }
        Ok(None)
    }

    /// The header, once every line is read: the file held as many keys as it promised.
    fn finish(self) -> Result<logical::Header> {
        let path = self.path;
        self.reader
            .finish()
            .map_err(|e| fail(format!("{}: {e}", path.display())))
    }
}

/// Checks the file, then puts its keys under the prefix in place of what is there.
pub async fn import_command(a: &ImportArgs) -> Result<()> {
    check_prefix(&a.prefix)?;
    let (sha, _) = super::tool::file_digest(&a.snapshot)?;
    if !sha.eq_ignore_ascii_case(a.sha256.trim()) {
        return Err(fail(format!(
            "{} has SHA-256 {sha}, the inventory recorded {}: not restoring from it",
            a.snapshot.display(),
            a.sha256
        )));
    }
    // Through once before anything is deleted: the sizes, for the transactions.
    let mut sizes = Vec::new();
    let mut file = FileReader::open(&a.snapshot)?;
    while let Some(e) = file.next_key()? {
        sizes.push(a.prefix.len() + e.rest.len() + e.value.len());
    }
    let header = file.finish()?;
    let gw = a.etcd.gateway()?;
    let token = a.login.token(&gw).await?;
    let put = import(&gw, token.as_deref(), &a.prefix, &a.snapshot, &sizes).await?;
    println!(
        "restored {put} keys of revision {} under {}",
        header.revision, a.prefix
    );
    Ok(())
}

/// Deletes the prefix's range and puts the file's keys under it; the keys put.
async fn import(
    gw: &Gateway,
    token: Option<&str>,
    prefix: &str,
    path: &Path,
    sizes: &[usize],
) -> Result<u64> {
    let (start, end) = prefix_range(prefix);
    gw.call(
        "/v3/kv/deleterange",
        json!({"key": b64(start.as_bytes()), "range_end": b64(end.as_bytes())}),
        token,
    )
    .await?;
    let mut file = FileReader::open(path)?;
    // One lease per minute of time left (logical::lease_ttl), granted when first needed.
    let mut leases: HashMap<i64, String> = HashMap::new();
    let mut put = 0u64;
    for run in logical::batches(sizes.iter().copied()) {
        let mut ops = Vec::with_capacity(run);
        for _ in 0..run {
            let Entry { rest, value, ttl } = file
                .next_key()?
                .ok_or_else(|| fail(format!("{} changed while restoring", path.display())))?;
            let mut key = prefix.as_bytes().to_vec();
            key.extend_from_slice(&rest);
            let mut op = json!({"key": b64(&key), "value": b64(&value)});
            if let Some(ttl) = ttl {
                let ttl = logical::lease_ttl(ttl);
                let id = match leases.get(&ttl) {
                    Some(id) => id.clone(),
                    None => {
                        let g = gw
                            .call("/v3/lease/grant", json!({"TTL": ttl}), token)
                            .await?;
                        let id = match &g["ID"] {
                            Value::String(s) => s.clone(),
                            v => v.to_string(),
                        };
                        leases.insert(ttl, id.clone());
                        id
                    }
                };
                op["lease"] = json!(id);
            }
            ops.push(json!({"request_put": op}));
        }
        put += ops.len() as u64;
        gw.call("/v3/kv/txn", json!({"success": ops}), token)
            .await?;
    }
    file.finish()?;
    Ok(put)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_absolute_without_a_trailing_slash() {
        assert!(check_prefix("/registry").is_ok());
        assert!(check_prefix("/vcp/ab12").is_ok());
        for bad in ["", "/", "registry", "/vcp/ab12/"] {
            assert!(check_prefix(bad).is_err(), "{bad:?}");
        }
    }
}
