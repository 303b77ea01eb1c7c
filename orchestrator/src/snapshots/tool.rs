//! `vcp tool ...`: the commands the snapshot and restore Jobs run inside a tenant's
//! control-plane namespace (the `vcp` image), with the etcd client certificate the tenant's
//! apiserver uses.
//!
//! - `etcd-snapshot` streams a snapshot from etcd's Maintenance API (through etcd's JSON
//!   gateway on the client port), checks etcd's SHA-256 trailer, writes the file atomically
//!   and prints a [`Report`] to the termination-message file, where the pass reads it.
//! - `etcd-restore-prepare` checks a snapshot file against the hash the inventory recorded and
//!   clears the staging directory `etcdutl snapshot restore` writes into.
//! - `etcd-restore-swap` moves the restored data in place of the member's data, keeping the
//!   old data beside it; idempotent, so a Job killed between its two renames finishes on retry.
//!
//! `etcd-export` and `etcd-import`, the logical snapshots of a tenant's keys, are in
//! [`super::transfer`].

use crate::snapshots::Report;
use crate::{Error, Result};
use base64::Engine as _;
use sha2::{Digest, Sha256};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `vcp tool ...`
#[derive(Debug, clap::Subcommand)]
pub enum ToolCommand {
    /// Save an etcd snapshot to a file and report it (run by the snapshot Job).
    EtcdSnapshot(SnapshotArgs),
    /// Check a snapshot's hash and clear the restore's staging directory (restore Job).
    EtcdRestorePrepare(PrepareArgs),
    /// Put restored data in place of a member's data (restore Job, last step).
    EtcdRestoreSwap(SwapArgs),
    /// Seal a snapshot file with the tenant's backup key and upload it (snapshot Job, last
    /// step, when a backup store is configured).
    BackupUpload(UploadArgs),
    /// Download a sealed snapshot, open it and write the file (restore Job, first step).
    BackupFetch(FetchArgs),
}

#[derive(Debug, clap::Args)]
pub struct UploadArgs {
    #[command(flatten)]
    pub store: crate::snapshots::offsite::StoreArgs,
    /// The snapshot file (removed once uploaded, with its report).
    #[arg(long, env = "VCP_SNAPSHOT_FILE")]
    pub file: PathBuf,
    /// The report the snapshot step wrote: the file must have its SHA-256.
    #[arg(long, env = "VCP_SNAPSHOT_REPORT_IN")]
    pub report_in: PathBuf,
    /// The object to write.
    #[arg(long, env = "VCP_BACKUP_OBJECT")]
    pub object: String,
    /// The tenant's backup key (32 raw bytes).
    #[arg(long, env = "VCP_BACKUP_KEY_FILE")]
    pub key_file: PathBuf,
    /// Its id, written in the object's header and reported.
    #[arg(long, env = "VCP_BACKUP_KEY_ID")]
    pub key_id: i64,
    /// Where the report (with the object's location) goes besides stdout.
    #[arg(
        long,
        env = "VCP_SNAPSHOT_REPORT",
        default_value = "/dev/termination-log"
    )]
    pub report: PathBuf,
}

#[derive(Debug, clap::Args)]
pub struct FetchArgs {
    #[command(flatten)]
    pub store: crate::snapshots::offsite::StoreArgs,
    /// The object to read.
    #[arg(long, env = "VCP_BACKUP_OBJECT")]
    pub object: String,
    /// The backup key that sealed it (32 raw bytes).
    #[arg(long, env = "VCP_BACKUP_KEY_FILE")]
    pub key_file: PathBuf,
    /// Its id, as the object's header must name it.
    #[arg(long, env = "VCP_BACKUP_KEY_ID")]
    pub key_id: i64,
    /// The snapshot file to write (only once whole and checked).
    #[arg(long, env = "VCP_SNAPSHOT_FILE")]
    pub out: PathBuf,
    /// The file's SHA-256 as the inventory recorded it, hex.
    #[arg(long, env = "VCP_SNAPSHOT_SHA256")]
    pub sha256: String,
}

/// A backup key file: 32 raw bytes.
pub fn read_key(path: &Path) -> Result<[u8; crate::snapshots::sealed::KEY_LEN]> {
    let bytes = std::fs::read(path).map_err(io(path))?;
    bytes.as_slice().try_into().map_err(|_| {
        fail(format!(
            "{}: a backup key is 32 bytes, this is {}",
            path.display(),
            bytes.len()
        ))
    })
}

async fn upload(a: &UploadArgs) -> Result<Report> {
    let text = std::fs::read_to_string(&a.report_in).map_err(io(&a.report_in))?;
    let mut r = Report::parse(&text).ok_or_else(|| {
        fail(format!(
            "{} holds no snapshot report: {text:.200}",
            a.report_in.display()
        ))
    })?;
    let store = crate::snapshots::offsite::Store::from_args(&a.store)?;
    let key = read_key(&a.key_file)?;
    let sent = store
        .upload_sealed(&a.file, &r.sha256, &key, a.key_id, &a.object)
        .await?;
    let location = format!("s3://{}/{}", a.store.bucket, a.object);
    tracing::info!(%location, bytes = sent, "snapshot sealed and uploaded");
    // The object is the copy of record (a restore fetches it, never trusting the claim), so
    // the claim's plaintext copy goes: scheduled backups would otherwise fill the claim, one
    // snapshot an hour, whatever retention prunes from the store.
    for f in [&a.file, &a.report_in] {
        match std::fs::remove_file(f) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(f)(e)),
        }
    }
    r.object = Some(location);
    r.backup_key = Some(a.key_id);
    Ok(r)
}

#[derive(Debug, clap::Args)]
pub struct SnapshotArgs {
    #[command(flatten)]
    pub etcd: crate::etcd::EtcdConnection,
    /// The snapshot file to write (atomically: a `.part` file renamed when complete).
    #[arg(long, env = "VCP_SNAPSHOT_FILE")]
    pub out: PathBuf,
    /// Where the report goes besides stdout: the container's termination-message file.
    #[arg(
        long,
        env = "VCP_SNAPSHOT_REPORT",
        default_value = "/dev/termination-log"
    )]
    pub report: PathBuf,
    /// Give up after this long.
    #[arg(long, env = "VCP_SNAPSHOT_TIMEOUT_SECONDS", default_value_t = 600)]
    pub timeout_seconds: u64,
}

#[derive(Debug, clap::Args)]
pub struct PrepareArgs {
    /// The snapshot file.
    #[arg(long, env = "VCP_SNAPSHOT_FILE")]
    pub snapshot: PathBuf,
    /// Its SHA-256 as the inventory recorded it, hex.
    #[arg(long, env = "VCP_SNAPSHOT_SHA256")]
    pub sha256: String,
    /// The directory `etcdutl snapshot restore` will create (removed if a previous attempt
    /// left it).
    #[arg(long, env = "VCP_RESTORE_STAGING")]
    pub staging: PathBuf,
}

#[derive(Debug, clap::Args)]
pub struct SwapArgs {
    /// The restored data directory.
    #[arg(long, env = "VCP_RESTORE_STAGING")]
    pub staging: PathBuf,
    /// The member's data directory.
    #[arg(long, env = "VCP_ETCD_DATA_DIR")]
    pub data_dir: PathBuf,
    /// Where the member's previous data is kept (replacing what an earlier restore kept).
    #[arg(long, env = "VCP_RESTORE_KEEP")]
    pub keep: PathBuf,
}

/// Runs a tool command.
pub async fn run(cmd: ToolCommand) -> Result<()> {
    match cmd {
        ToolCommand::EtcdSnapshot(a) => {
            let r = snapshot(&a).await?;
            let text = serde_json::to_string(&r).expect("a report encodes");
            println!("{text}");
            // The report is the result; without it the Job's work cannot be recorded.
            std::fs::write(&a.report, &text).map_err(io(&a.report))?;
            Ok(())
        }
        ToolCommand::EtcdRestorePrepare(a) => prepare(&a),
        ToolCommand::EtcdRestoreSwap(a) => swap(&a.staging, &a.data_dir, &a.keep),
        ToolCommand::BackupUpload(a) => {
            let r = upload(&a).await?;
            let text = serde_json::to_string(&r).expect("a report encodes");
            println!("{text}");
            std::fs::write(&a.report, &text).map_err(io(&a.report))?;
            Ok(())
        }
        ToolCommand::BackupFetch(a) => {
            let store = crate::snapshots::offsite::Store::from_args(&a.store)?;
            let key = read_key(&a.key_file)?;
            let size = store
                .download_opened(&a.object, &key, a.key_id, &a.out, &a.sha256)
                .await?;
            tracing::info!(object = %a.object, bytes = size, "snapshot fetched and opened");
            Ok(())
        }
    }
}

fn fail(m: impl Into<String>) -> Error {
    Error::Snapshot(m.into())
}

fn io(p: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| fail(format!("{}: {e}", p.display()))
}

/// Hashes a stream except its last 32 bytes, and checks them against that hash: etcd ends a
/// snapshot stream with the SHA-256 of the database before it.
#[derive(Default)]
pub struct TrailerCheck {
    hasher: Sha256,
    held: Vec<u8>,
}

impl TrailerCheck {
    pub fn feed(&mut self, bytes: &[u8]) {
        self.held.extend_from_slice(bytes);
        if self.held.len() > 32 {
            let cut = self.held.len() - 32;
            self.hasher.update(&self.held[..cut]);
            self.held.drain(..cut);
        }
    }

    /// Whether the trailer matches the data before it.
    pub fn matches(self) -> bool {
        self.held.len() == 32 && self.hasher.finalize().as_slice() == self.held.as_slice()
    }
}

/// One message of etcd's gateway stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Message {
    Chunk { blob: Vec<u8>, version: String },
    Error(String),
}

/// Splits etcd's JSON gateway stream (one JSON object per line, `{"result": ...}` or
/// `{"error": ...}`) into messages, across chunk boundaries.
#[derive(Default)]
pub struct GatewayLines {
    buf: Vec<u8>,
}

impl GatewayLines {
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<Message>> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(end) = self.buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=end).collect();
            if let Some(m) = parse_line(&line)? {
                out.push(m);
            }
        }
        Ok(out)
    }

    /// The last message, if the stream did not end with a newline.
    pub fn finish(mut self) -> Result<Option<Message>> {
        let line = std::mem::take(&mut self.buf);
        parse_line(&line)
    }
}

fn parse_line(line: &[u8]) -> Result<Option<Message>> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let v: serde_json::Value = serde_json::from_slice(line)
        .map_err(|e| fail(format!("etcd sent a line that is not JSON: {e}")))?;
    if let Some(e) = v.get("error") {
        let m = e["message"].as_str().unwrap_or("unknown error");
        return Ok(Some(Message::Error(m.to_owned())));
    }
    let r = v
        .get("result")
        .ok_or_else(|| fail("etcd sent a message with neither result nor error"))?;
    let blob = match r.get("blob").and_then(|b| b.as_str()) {
        None => Vec::new(),
        Some(b) => base64::engine::general_purpose::STANDARD
            .decode(b)
            .map_err(|e| fail(format!("etcd sent a blob that is not base64: {e}")))?,
    };
    let version = r["version"].as_str().unwrap_or_default().to_owned();
    Ok(Some(Message::Chunk { blob, version }))
}

fn client(a: &SnapshotArgs) -> Result<reqwest::Client> {
    let (ca, identity) = a.etcd.read()?;
    reqwest::Client::builder()
        .add_root_certificate(
            reqwest::Certificate::from_pem(&ca).map_err(|e| fail(format!("ca file: {e}")))?,
        )
        .identity(
            reqwest::Identity::from_pem(&identity)
                .map_err(|e| fail(format!("client certificate: {e}")))?,
        )
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(a.timeout_seconds))
        .build()
        .map_err(|e| fail(format!("etcd client: {e}")))
}

/// Takes the snapshot from the first endpoint that answers.
pub async fn snapshot(a: &SnapshotArgs) -> Result<Report> {
    let http = client(a)?;
    let mut errors = Vec::new();
    for endpoint in &a.etcd.endpoints {
        match snapshot_from(&http, endpoint.trim_end_matches('/'), &a.out).await {
            Ok(r) => return Ok(r),
            Err(e) => {
                tracing::warn!(endpoint, error = %e, "snapshot failed; trying the next member");
                errors.push(format!("{endpoint}: {e}"));
            }
        }
    }
    Err(fail(errors.join("; ")))
}

async fn snapshot_from(http: &reqwest::Client, endpoint: &str, out: &Path) -> Result<Report> {
    let call = |path: &str| {
        http.post(format!("{endpoint}{path}"))
            .header("content-type", "application/json")
    };
    // The revision first: the snapshot holds at least this one.
    let range: serde_json::Value = call("/v3/kv/range")
        .body(r#"{"key":"AA==","count_only":true}"#)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| fail(format!("revision: {e}")))?
        .json()
        .await
        .map_err(|e| fail(format!("revision: {e}")))?;
    let revision: i64 = range["header"]["revision"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .ok_or_else(|| fail(format!("etcd answered without a revision: {range}")))?;

    let mut resp = call("/v3/maintenance/snapshot")
        .body("{}")
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| fail(format!("snapshot: {e}")))?;
    let part = out.with_extension("db.part");
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let mut file = std::fs::File::create(&part).map_err(io(&part))?;
    let (mut lines, mut trailer, mut whole) = (
        GatewayLines::default(),
        TrailerCheck::default(),
        Sha256::new(),
    );
    let (mut size, mut storage_version) = (0i64, String::new());
    let mut take = |m: Message| -> Result<()> {
        match m {
            Message::Error(e) => Err(fail(format!("etcd ended the snapshot: {e}"))),
            Message::Chunk { blob, version } => {
                file.write_all(&blob).map_err(io(&part))?;
                trailer.feed(&blob);
                whole.update(&blob);
                size += blob.len() as i64;
                if !version.is_empty() {
                    storage_version = version;
                }
                Ok(())
            }
        }
    };
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| fail(format!("snapshot stream: {e}")))?
    {
        for m in lines.feed(&chunk)? {
            take(m)?;
        }
    }
    if let Some(m) = lines.finish()? {
        take(m)?;
    }
    if !trailer.matches() {
        return Err(fail(
            "the snapshot stream ended early or its SHA-256 trailer does not match",
        ));
    }
    file.sync_all().map_err(io(&part))?;
    drop(file);
    std::fs::rename(&part, out).map_err(io(out))?;
    if let Some(dir) = out.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io(dir))?;
    }
    Ok(Report {
        revision,
        size,
        sha256: hex(&whole.finalize()),
        storage_version,
        object: None,
        backup_key: None,
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of a file, hex, and whether etcd's trailer in it matches.
pub fn file_digest(path: &Path) -> Result<(String, bool)> {
    use std::io::Read as _;
    let mut f = std::fs::File::open(path).map_err(io(path))?;
    let (mut whole, mut trailer) = (Sha256::new(), TrailerCheck::default());
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf).map_err(io(path))?;
        if n == 0 {
            break;
        }
        whole.update(&buf[..n]);
        trailer.feed(&buf[..n]);
    }
    Ok((hex(&whole.finalize()), trailer.matches()))
}

fn prepare(a: &PrepareArgs) -> Result<()> {
    let (sha, trailer) = file_digest(&a.snapshot)?;
    if !sha.eq_ignore_ascii_case(a.sha256.trim()) {
        return Err(fail(format!(
            "{} has SHA-256 {sha}, the inventory recorded {}: not restoring from it",
            a.snapshot.display(),
            a.sha256
        )));
    }
    if !trailer {
        return Err(fail(format!(
            "{}: etcd's integrity trailer does not match",
            a.snapshot.display()
        )));
    }
    match std::fs::remove_dir_all(&a.staging) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(&a.staging)(e)),
        _ => Ok(()),
    }
}

/// Moves `staging` to `data`, the old `data` to `keep`. Safe to run again after any crash:
/// with `staging` gone the swap is done; with `data` gone only the second rename is left.
pub fn swap(staging: &Path, data: &Path, keep: &Path) -> Result<()> {
    if !staging.exists() {
        return if data.exists() {
            Ok(())
        } else {
            Err(fail(format!(
                "neither {} nor {} exists",
                staging.display(),
                data.display()
            )))
        };
    }
    if data.exists() {
        match std::fs::remove_dir_all(keep) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(keep)(e)),
            _ => {}
        }
        std::fs::rename(data, keep).map_err(io(data))?;
    }
    std::fs::rename(staging, data).map_err(io(staging))?;
    if let Some(dir) = data.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io(dir))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn stream(data: &[u8]) -> Vec<u8> {
        let mut s = data.to_vec();
        s.extend_from_slice(&Sha256::digest(data));
        s
    }

    proptest! {
        #[test]
        fn the_trailer_is_checked_however_the_stream_is_cut(
            data in proptest::collection::vec(any::<u8>(), 0..300),
            cuts in proptest::collection::vec(1usize..70, 0..10),
        ) {
            let s = stream(&data);
            let mut t = TrailerCheck::default();
            let mut rest: &[u8] = &s;
            for c in cuts {
                let c = c.min(rest.len());
                t.feed(&rest[..c]);
                rest = &rest[c..];
            }
            t.feed(rest);
            prop_assert!(t.matches());
            // One flipped byte anywhere, or a missing tail, fails it.
            let mut bad = s.clone();
            let i = data.len() / 2;
            bad[i] ^= 1;
            let mut t = TrailerCheck::default();
            t.feed(&bad);
            prop_assert!(!t.matches());
            let mut t = TrailerCheck::default();
            t.feed(&s[..s.len() - 1]);
            prop_assert!(!t.matches());
        }
    }

    #[test]
    fn gateway_lines_are_decoded_across_chunks_and_errors_are_kept() {
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let text = format!(
            "{{\"result\":{{\"remaining_bytes\":\"3\",\"blob\":\"{}\",\"version\":\"3.6.0\"}}}}\n\
             {{\"result\":{{\"blob\":\"{}\"}}}}\n{{\"error\":{{\"code\":14,\"message\":\"gone\"}}}}",
            b64(b"abc"),
            b64(b"de")
        );
        let mut g = GatewayLines::default();
        let mut got = Vec::new();
        for piece in text.as_bytes().chunks(7) {
            got.extend(g.feed(piece).unwrap());
        }
        got.extend(g.finish().unwrap());
        assert_eq!(
            got,
            [
                Message::Chunk {
                    blob: b"abc".to_vec(),
                    version: "3.6.0".into()
                },
                Message::Chunk {
                    blob: b"de".to_vec(),
                    version: String::new()
                },
                Message::Error("gone".into()),
            ]
        );
        assert!(GatewayLines::default().feed(b"not json\n").is_err());
    }

    #[test]
    fn a_swap_is_idempotent_and_keeps_the_old_data() {
        let d = tempfile::tempdir().unwrap();
        let (staging, data, keep) = (
            d.path().join("s"),
            d.path().join("data"),
            d.path().join("k"),
        );
        std::fs::create_dir_all(&staging).unwrap();
        std::fs::write(staging.join("new"), "1").unwrap();
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("old"), "0").unwrap();
        std::fs::create_dir_all(&keep).unwrap();
        std::fs::write(keep.join("older"), "-1").unwrap();
        swap(&staging, &data, &keep).unwrap();
        assert!(data.join("new").exists() && keep.join("old").exists());
        assert!(!keep.join("older").exists() && !staging.exists());
        // Again: nothing to do.
        swap(&staging, &data, &keep).unwrap();
        assert!(data.join("new").exists());
        // Killed between the renames: data moved away, staging still there.
        std::fs::rename(&data, d.path().join("moved")).unwrap();
        std::fs::create_dir_all(&staging).unwrap();
        swap(&staging, &data, &keep).unwrap();
        assert!(data.exists() && !staging.exists());
        // Nothing at all is an error, not a silent success.
        std::fs::remove_dir_all(&data).unwrap();
        assert!(swap(&staging, &data, &keep).is_err());
    }

    #[test]
    fn prepare_refuses_a_file_whose_hash_differs() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("snap.db");
        std::fs::write(&f, stream(b"database")).unwrap();
        let (sha, trailer) = file_digest(&f).unwrap();
        assert!(trailer);
        let staging = d.path().join("staging");
        std::fs::create_dir_all(staging.join("member")).unwrap();
        let args = |sha: &str| PrepareArgs {
            snapshot: f.clone(),
            sha256: sha.to_owned(),
            staging: staging.clone(),
        };
        let e = prepare(&args(&"0".repeat(64))).unwrap_err().to_string();
        assert!(e.contains("not restoring"), "{e}");
        assert!(staging.exists(), "a refused restore touches nothing");
        prepare(&args(&sha.to_uppercase())).unwrap();
        assert!(!staging.exists());
    }
}
