//! The backup store's configuration and naming (pure): what `vcp serve --backup-store FILE`
//! names, where each tenant's sealed snapshots go in it, the host Secret that hands the
//! backup Jobs the credentials and keys, and the schedules a plan or a tenant asks backups on
//! (their sweep: [`crate::snapshots::schedule`]). The configured store sits in the provisioner's
//! configuration, which every layer reads; the client that talks to the store, and the Jobs'
//! commands, are in [`crate::snapshots::offsite`].

use crate::{Error, Result};
use serde::{Deserialize, Serialize};

/// The host Secret, in each tenant's control-plane namespace, that gives the backup Jobs the
/// store's credentials and the tenant's backup keys (`key-<id>`, raw 32 bytes each).
pub const SECRET: &str = "vcp-backup";
/// Where the backup Jobs mount [`SECRET`].
pub const SECRET_MOUNT: &str = "/etc/vcp-backup";
/// Suffix of every object: the snapshot file's name, sealed.
pub const SUFFIX: &str = ".enc";

/// `--backup-store FILE`: where backups go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// The S3 API's URL (`https://s3.example.com`; `http://` only where the path to it is
    /// trusted, as in the dev environment).
    pub endpoint: String,
    pub bucket: String,
    /// Objects go under `<prefix>/<tenant key>/`; empty: under `<tenant key>/`.
    #[serde(default)]
    pub prefix: String,
    #[serde(default = "default_region")]
    pub region: String,
}

fn default_region() -> String {
    "us-east-1".to_owned()
}

impl StoreConfig {
    /// Reads and checks a `--backup-store` file's text.
    pub fn parse(text: &str) -> Result<StoreConfig> {
        let c: StoreConfig = serde_yaml::from_str(text)
            .map_err(|e| Error::Config(format!("--backup-store: {e}")))?;
        c.validate()
            .map_err(|e| Error::Config(format!("--backup-store: {e}")))?;
        Ok(c)
    }

    fn validate(&self) -> Result<(), String> {
        let scheme_ok = ["http://", "https://"]
            .iter()
            .any(|s| self.endpoint.strip_prefix(s).is_some_and(|h| !h.is_empty()));
        if !scheme_ok || self.endpoint.contains(char::is_whitespace) {
            return Err(format!(
                "endpoint {:?} is not an http(s) URL",
                self.endpoint
            ));
        }
        // S3's bucket naming rules (the common subset every implementation takes).
        let b = &self.bucket;
        let bucket_ok = (3..=63).contains(&b.len())
            && b.bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.')
            && !b.starts_with(['-', '.'])
            && !b.ends_with(['-', '.']);
        if !bucket_ok {
            return Err(format!(
                "bucket {b:?} is not an S3 bucket name (3-63 of a-z, 0-9, '-', '.')"
            ));
        }
        let prefix_ok = self.prefix.len() <= 256
            && self.prefix.split('/').filter(|s| !s.is_empty()).all(|s| {
                s != ".."
                    && s != "."
                    && s.bytes()
                        .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(&c))
            });
        if !prefix_ok {
            return Err(format!(
                "prefix {:?} must be path segments of a-z, A-Z, 0-9, '-', '_', '.'",
                self.prefix
            ));
        }
        if self.region.is_empty() || self.region.len() > 64 {
            return Err("region must be 1 to 64 characters".into());
        }
        Ok(())
    }

    /// The TCP port the endpoint names (or its scheme's): what the Jobs' egress policy opens.
    pub fn port(&self) -> u16 {
        let (https, rest) = match self.endpoint.strip_prefix("https://") {
            Some(r) => (true, r),
            None => (false, self.endpoint.trim_start_matches("http://")),
        };
        let authority = rest.split('/').next().unwrap_or_default();
        // After the last ':' outside an IPv6 literal's brackets.
        let port = authority
            .rsplit_once(':')
            .filter(|(_, p)| !p.contains(']'))
            .and_then(|(_, p)| p.parse().ok());
        port.unwrap_or(if https { 443 } else { 80 })
    }

    /// The key of the object that keeps `file` (a snapshot file name) of tenant `key`.
    pub fn object_key(&self, key: &str, file: &str) -> String {
        object_key(&self.prefix, key, file)
    }

    /// `s3://<bucket>/<object key>`: a snapshot's location once it is uploaded.
    pub fn location(&self, object_key: &str) -> String {
        format!("s3://{}/{object_key}", self.bucket)
    }
}

/// `<prefix>/<tenant key>/<file>.enc`. Tenant keys are unique for good (never reused by a
/// later tenant, deleted ones included) and a tenant's snapshot files are numbered by the
/// tenant, so no two snapshots of any tenants ever share an object.
pub fn object_key(prefix: &str, key: &str, file: &str) -> String {
    let prefix = prefix.trim_matches('/');
    if prefix.is_empty() {
        format!("{key}/{file}{SUFFIX}")
    } else {
        format!("{prefix}/{key}/{file}{SUFFIX}")
    }
}

/// The bucket and object key of an `s3://` location; `None` for any other location (a
/// snapshot kept only on its claim).
pub fn parse_location(location: &str) -> Option<(&str, &str)> {
    let rest = location.strip_prefix("s3://")?;
    let (bucket, key) = rest.split_once('/')?;
    (!bucket.is_empty() && !key.is_empty()).then_some((bucket, key))
}

/// The name of backup key `id` in [`SECRET`].
pub fn key_entry(id: i64) -> String {
    format!("key-{id}")
}

/// The store's access key, from the platform's Secret (`--backup-access-key-id`,
/// `--backup-secret-access-key`). Its `Debug` shows neither.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").finish_non_exhaustive()
    }
}

/// A configured store: where, and with what credentials.
#[derive(Debug, Clone)]
pub struct BackupStore {
    pub config: StoreConfig,
    pub credentials: Credentials,
}

/// The most snapshots a schedule keeps.
pub const MAX_KEEP: u32 = 1000;

/// A plan's `backups`, or a tenant's own (`PATCH /v1/tenants/{name}`): how many of each
/// schedule's snapshots to keep.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BackupPlan {
    /// Snapshots taken each UTC hour, the newest this many kept (0: none).
    #[serde(default)]
    #[schema(maximum = 1000)]
    pub hourly: u32,
    /// Snapshots taken each UTC day, the newest this many kept (0: none).
    #[serde(default)]
    #[schema(maximum = 1000)]
    pub daily: u32,
}

impl BackupPlan {
    pub fn validate(&self) -> Result<(), String> {
        if self.hourly > MAX_KEEP || self.daily > MAX_KEEP {
            return Err(format!(
                "backups.hourly and backups.daily keep 0 to {MAX_KEEP} snapshots"
            ));
        }
        Ok(())
    }

    /// How many of `s`'s snapshots to keep.
    pub fn keep(&self, s: Schedule) -> u32 {
        match s {
            Schedule::Hourly => self.hourly,
            Schedule::Daily => self.daily,
        }
    }
}

/// A backup schedule; stored as its lowercase name (a value the database holds that is not one
/// of these fails to decode, rather than passing as one).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    sqlx::Type,
    utoipa::ToSchema,
)]
#[sqlx(type_name = "text", rename_all = "lowercase")]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    Hourly,
    Daily,
}

impl Schedule {
    pub const ALL: [Schedule; 2] = [Schedule::Hourly, Schedule::Daily];

    /// The start of the period `now` falls in (UTC).
    pub fn period(self, now: time::OffsetDateTime) -> time::OffsetDateTime {
        let now = now.to_offset(time::UtcOffset::UTC);
        let t = now
            .replace_nanosecond(0)
            .and_then(|t| t.replace_second(0))
            .and_then(|t| t.replace_minute(0))
            .expect("zero is a valid minute, second and nanosecond");
        match self {
            Schedule::Hourly => t,
            Schedule::Daily => t.replace_hour(0).expect("zero is a valid hour"),
        }
    }
}
