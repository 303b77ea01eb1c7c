//! Backups off the host cluster: the S3-compatible store the platform names
//! (`vcp serve --backup-store FILE`), where each snapshot goes encrypted ([`super::sealed`]).
//!
//! Data flow: the snapshot Job writes the file onto the tenant's claim as before; when a store
//! is configured, its last container (`vcp tool backup-upload`) checks the file against the
//! snapshot container's report, seals it with the tenant's backup key as it reads it and
//! streams it to `<prefix>/<tenant key>/<file>.enc` ([`object_key`]) with a multipart upload,
//! then reports the object's `s3://bucket/key` location, which the pass records as the
//! snapshot's location. A restore from such a snapshot first runs `vcp tool backup-fetch`,
//! which streams the object back, opens it and writes the file onto the claim only if its
//! SHA-256 is the one recorded; the existing restore steps follow. `vcp serve` itself only
//! deletes objects ([`Store::delete`]) when retention expires them ([`super::schedule`]).
//!
//! The naming and the configuration are pure; [`Store`] is the one place that talks to the
//! object store (`object_store`'s S3 client; path-style requests, so any S3-compatible server
//! works).

use crate::{Error, Result};
use futures::StreamExt as _;
use object_store::ObjectStoreExt as _;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, WriteMultipart};
use sha2::{Digest, Sha256};
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use crate::backup_store::{
    BackupStore, Credentials, SECRET, SECRET_MOUNT, SUFFIX, StoreConfig, key_entry, object_key,
    parse_location,
};

/// The flags that name a store and its credentials, shared by `vcp tool backup-*`.
#[derive(Debug, Clone, clap::Args)]
pub struct StoreArgs {
    /// The S3 API's URL.
    #[arg(long, env = "VCP_BACKUP_ENDPOINT")]
    pub endpoint: String,
    /// The bucket.
    #[arg(long, env = "VCP_BACKUP_BUCKET")]
    pub bucket: String,
    /// The bucket's region.
    #[arg(long, env = "VCP_BACKUP_REGION", default_value = "us-east-1")]
    pub region: String,
    /// The access key id.
    #[arg(long, env = "VCP_BACKUP_ACCESS_KEY_ID", hide_env_values = true)]
    pub access_key_id: String,
    /// The secret access key.
    #[arg(long, env = "VCP_BACKUP_SECRET_ACCESS_KEY", hide_env_values = true)]
    pub secret_access_key: String,
}

/// A client of the store's bucket.
#[derive(Debug, Clone)]
pub struct Store {
    s3: Arc<AmazonS3>,
    bucket: String,
}

fn os(context: impl Into<String>) -> impl FnOnce(object_store::Error) -> Error {
    let context = context.into();
    move |e| Error::ObjectStore {
        context,
        source: Box::new(e),
    }
}

fn fail(m: impl Into<String>) -> Error {
    Error::Backup(m.into())
}

fn io(p: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| fail(format!("{}: {e}", p.display()))
}

impl Store {
    /// A client of `bucket` at `endpoint` (path-style requests, which every S3-compatible
    /// server takes; plain HTTP allowed only for an `http://` endpoint).
    pub fn new(endpoint: &str, bucket: &str, region: &str, c: &Credentials) -> Result<Store> {
        let s3 = AmazonS3Builder::new()
            .with_endpoint(endpoint)
            .with_bucket_name(bucket)
            .with_region(region)
            .with_access_key_id(&c.access_key_id)
            .with_secret_access_key(&c.secret_access_key)
            .with_virtual_hosted_style_request(false)
            .with_client_options(
                ClientOptions::new().with_allow_http(endpoint.starts_with("http://")),
            )
            .build()
            .map_err(os(format!(
                "configure a client of bucket {bucket} at {endpoint}"
            )))?;
        Ok(Store {
            s3: Arc::new(s3),
            bucket: bucket.to_owned(),
        })
    }

    /// The platform's store.
    pub fn open(b: &BackupStore) -> Result<Store> {
        Store::new(
            &b.config.endpoint,
            &b.config.bucket,
            &b.config.region,
            &b.credentials,
        )
    }

    /// The store `vcp tool` flags name.
    pub fn from_args(a: &StoreArgs) -> Result<Store> {
        Store::new(
            &a.endpoint,
            &a.bucket,
            &a.region,
            &Credentials {
                access_key_id: a.access_key_id.clone(),
                secret_access_key: a.secret_access_key.clone(),
            },
        )
    }

    /// Deletes an object; one that is not there is deleted already.
    pub async fn delete(&self, key: &str) -> Result<()> {
        match self.s3.delete(&ObjectPath::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(os(format!("delete s3://{}/{key}", self.bucket))(e)),
        }
    }

    /// An object's bytes, whole (for tests and small objects).
    pub async fn get(&self, key: &str) -> Result<Vec<u8>> {
        let what = || format!("read s3://{}/{key}", self.bucket);
        let r = self
            .s3
            .get(&ObjectPath::from(key))
            .await
            .map_err(os(what()))?;
        Ok(r.bytes().await.map_err(os(what()))?.to_vec())
    }

    /// Whether an object exists.
    pub async fn exists(&self, key: &str) -> Result<bool> {
        match self.s3.head(&ObjectPath::from(key)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(os(format!("look up s3://{}/{key}", self.bucket))(e)),
        }
    }

    /// Writes an object whole (tests).
    pub async fn put(&self, key: &str, bytes: Vec<u8>) -> Result<()> {
        self.s3
            .put(&ObjectPath::from(key), bytes.into())
            .await
            .map_err(os(format!("write s3://{}/{key}", self.bucket)))?;
        Ok(())
    }

    /// Seals `file` with `key` (backup key `key_id`) as it reads it and uploads it to
    /// `object`; the file's SHA-256 must be `sha256` (the snapshot's report), or the upload is
    /// abandoned and nothing is left under `object`. The bytes uploaded.
    pub async fn upload_sealed(
        &self,
        file: &Path,
        sha256: &str,
        key: &[u8; super::sealed::KEY_LEN],
        key_id: i64,
        object: &str,
    ) -> Result<u64> {
        let what = format!("upload s3://{}/{object}", self.bucket);
        let upload = self
            .s3
            .put_multipart(&ObjectPath::from(object))
            .await
            .map_err(os(what.clone()))?;
        let mut w = WriteMultipart::new(upload);
        let mut sealer = super::sealed::Sealer::random(
            key,
            u64::try_from(key_id).map_err(|_| fail("negative backup key id"))?,
        );
        let mut f = std::fs::File::open(file).map_err(io(file))?;
        let (mut hash, mut buf, mut sent) = (Sha256::new(), vec![0u8; 1 << 16], 0u64);
        let result: Result<()> = async {
            loop {
                let n = f.read(&mut buf).map_err(io(file))?;
                if n == 0 {
                    break;
                }
                hash.update(&buf[..n]);
                let out = sealer.push(&buf[..n]);
                sent += out.len() as u64;
                w.wait_for_capacity(4).await.map_err(os(what.clone()))?;
                w.write(&out);
            }
            let got = vcp_pki::hex(&hash.finalize_reset());
            if !got.eq_ignore_ascii_case(sha256.trim()) {
                return Err(fail(format!(
                    "{} has SHA-256 {got}, its report says {sha256}: not uploading it",
                    file.display()
                )));
            }
            Ok(())
        }
        .await;
        if let Err(e) = result {
            let _ = w.abort().await;
            return Err(e);
        }
        let out = sealer.finish();
        sent += out.len() as u64;
        w.write(&out);
        w.finish().await.map_err(os(what))?;
        Ok(sent)
    }

    /// Downloads `object`, opens it with `key` (backup key `key_id`) as it streams and writes
    /// the plaintext to `out` (atomically: a `.part` file renamed once whole), but only if its
    /// SHA-256 is `sha256`. Nothing is written under `out` otherwise.
    pub async fn download_opened(
        &self,
        object: &str,
        key: &[u8; super::sealed::KEY_LEN],
        key_id: i64,
        out: &Path,
        sha256: &str,
    ) -> Result<u64> {
        let what = format!("read s3://{}/{object}", self.bucket);
        let mut stream = self
            .s3
            .get(&ObjectPath::from(object))
            .await
            .map_err(os(what.clone()))?
            .into_stream();
        let mut opener = super::sealed::Opener::new(
            key,
            u64::try_from(key_id).map_err(|_| fail("negative backup key id"))?,
        );
        let part = part_path(out);
        if let Some(dir) = out.parent() {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }
        let mut f = std::fs::File::create(&part).map_err(io(&part))?;
        let (mut hash, mut size) = (Sha256::new(), 0u64);
        let result: Result<()> = async {
            let mut put = |plain: Vec<u8>| -> Result<()> {
                hash.update(&plain);
                size += plain.len() as u64;
                f.write_all(&plain).map_err(io(&part))
            };
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(os(what.clone()))?;
                put(opener.push(&chunk)?)?;
            }
            put(opener.finish()?)?;
            Ok(())
        }
        .await;
        let checked = result.and_then(|()| {
            let got = vcp_pki::hex(&hash.finalize());
            if got.eq_ignore_ascii_case(sha256.trim()) {
                Ok(())
            } else {
                Err(fail(format!(
                    "s3://{}/{object} opens to a file with SHA-256 {got}, the inventory recorded \
                     {sha256}: not restoring from it",
                    self.bucket
                )))
            }
        });
        if let Err(e) = checked {
            let _ = std::fs::remove_file(&part);
            return Err(e);
        }
        f.sync_all().map_err(io(&part))?;
        drop(f);
        std::fs::rename(&part, out).map_err(io(out))?;
        Ok(size)
    }
}

/// A `.part` file beside `out` of this process alone: the restore Jobs of several etcd members
/// may fetch the same file onto one claim at once, and each renames only its own whole copy.
fn part_path(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(format!(
        ".{}.part",
        vcp_pki::hex(&vcp_pki::random_bytes::<6>())
    ));
    out.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Result<StoreConfig> {
        StoreConfig::parse(text)
    }

    #[test]
    fn a_store_is_read_with_its_defaults_and_checked() {
        let c = config("endpoint: http://10.245.0.1:9000\nbucket: vcp\n").unwrap();
        assert_eq!((c.prefix.as_str(), c.region.as_str()), ("", "us-east-1"));
        for bad in [
            "endpoint: s3.example.com\nbucket: vcp\n",
            "endpoint: http://\nbucket: vcp\n",
            "endpoint: https://s3\nbucket: Vcp\n",
            "endpoint: https://s3\nbucket: v\n",
            "endpoint: https://s3\nbucket: -vcp\n",
            "endpoint: https://s3\nbucket: vcp\nprefix: a/../b\n",
            "endpoint: https://s3\nbucket: vcp\nprefix: a b\n",
            "endpoint: https://s3\nbucket: vcp\nregion: ''\n",
            "endpoint: https://s3\nbucket: vcp\nsecret: x\n",
        ] {
            assert!(config(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_port_is_the_endpoints_or_its_schemes() {
        let port = |e: &str| {
            config(&format!("endpoint: {e}\nbucket: vcp\n"))
                .unwrap()
                .port()
        };
        assert_eq!(port("http://10.245.0.1:9000"), 9000);
        assert_eq!(port("https://s3.example.com/"), 443);
        assert_eq!(port("http://s3.example.com/x:1"), 80);
        assert_eq!(port("https://[2001:db8::1]:8443"), 8443);
        assert_eq!(port("https://[2001:db8::1]"), 443);
    }

    #[test]
    fn objects_are_named_by_prefix_tenant_key_and_file() {
        let c = config("endpoint: https://s3\nbucket: vcp\nprefix: /prod/eu/\n").unwrap();
        let k = c.object_key("a1b2c3", "snapshot-7.db");
        assert_eq!(k, "prod/eu/a1b2c3/snapshot-7.db.enc");
        assert_eq!(c.location(&k), "s3://vcp/prod/eu/a1b2c3/snapshot-7.db.enc");
        assert_eq!(
            parse_location(&c.location(&k)),
            Some(("vcp", "prod/eu/a1b2c3/snapshot-7.db.enc"))
        );
        assert_eq!(
            object_key("", "k", "snapshot-1.vcpl"),
            "k/snapshot-1.vcpl.enc"
        );
        assert_eq!(
            parse_location("pvc://vcp-cp-x/etcd-snapshots/snapshot-1.db"),
            None
        );
        assert_eq!(parse_location("s3://vcp/"), None);
        assert_ne!(key_entry(1), key_entry(11));
    }

    #[test]
    fn each_fetch_writes_its_own_part_file() {
        let out = Path::new("/snapshots/snapshot-3.db");
        let (a, b) = (part_path(out), part_path(out));
        assert_ne!(a, b);
        assert_eq!(a.parent(), out.parent());
        assert!(a.to_string_lossy().starts_with("/snapshots/snapshot-3.db."));
    }

    #[test]
    fn credentials_do_not_show_in_debug() {
        let c = Credentials {
            access_key_id: "AKIAEXAMPLE".into(),
            secret_access_key: "shh".into(),
        };
        let d = format!("{c:?}");
        assert!(!d.contains("AKIA") && !d.contains("shh"), "{d}");
    }
}
