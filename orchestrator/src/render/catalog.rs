//! The versions catalog (`templates/versions.yaml`): which Kubernetes releases vcp provisions,
//! with which images and flags, and where each minor is in its life ([`Class`]) (pure).
//!
//! New tenants resolve their version here ([`Catalog::resolve_new`]: no `expired` minor, a
//! `preview` one only on request); upgrades plan their hops from it (`crate::lifecycle::skew`).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One supported Kubernetes minor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Version {
    /// `"1.37"`.
    pub minor: String,
    /// The release the images carry, `"v1.37.1"`.
    pub kubernetes: String,
    /// Where this minor is in its life.
    pub class: Class,
    /// Component name (`etcd`, `kube-apiserver`, `kube-controller-manager`, `coredns`) -> image.
    pub images: BTreeMap<String, String>,
    /// Extra kube-apiserver flags for this minor.
    #[serde(default)]
    pub apiserver_flags: Vec<String>,
    /// Extra kube-controller-manager flags for this minor.
    #[serde(default)]
    pub controller_manager_flags: Vec<String>,
    /// This minor's apiserver stores some resource in a way the minor before it cannot read
    /// (a new storage version, an encoding change): rolling back a hop into it restores the
    /// etcd snapshot taken before the hop (`crate::lifecycle::upgrade::rollback_restore`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub storage_change: bool,
    /// Other releases of this minor than `kubernetes`: older ones tenants still run, newer
    /// ones being tried out (`class: preview`). Automatic patch updates move a tenant to the
    /// newest release of its minor that is `supported` or `deprecated`
    /// (`crate::upgrades::auto`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patches: Vec<Patch>,
}

/// Another release of a minor: what differs from the minor's entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Patch {
    /// `"v1.37.0"`: a release of the entry's minor.
    pub kubernetes: String,
    /// Its class; the minor's when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<Class>,
    /// The images that differ from the minor's (component -> image).
    #[serde(default)]
    pub images: BTreeMap<String, String>,
}

impl Version {
    /// Every release of this minor with its class: `kubernetes` first, then the patches.
    pub fn releases(&self) -> impl Iterator<Item = (&str, Class)> {
        std::iter::once((self.kubernetes.as_str(), self.class)).chain(
            self.patches
                .iter()
                .map(|p| (p.kubernetes.as_str(), p.class.unwrap_or(self.class))),
        )
    }

    /// This minor's entry as one of its releases runs it: that release's images (the minor's
    /// for a component the patch does not name). `None` for a release this minor does not list.
    pub fn at_release(&self, release: &str) -> Option<Version> {
        if release == self.kubernetes {
            return Some(self.clone());
        }
        let p = self.patches.iter().find(|p| p.kubernetes == release)?;
        let mut v = self.clone();
        v.kubernetes = p.kubernetes.clone();
        v.class = p.class.unwrap_or(self.class);
        v.images
            .extend(p.images.iter().map(|(k, i)| (k.clone(), i.clone())));
        Some(v)
    }
}

/// The patch number of a release (`"v1.37.2"`: 2); `None` for anything else.
pub fn patch_number(release: &str) -> Option<u32> {
    let mut parts = release.strip_prefix("v1.")?.split('.');
    let (_minor, patch) = (parts.next()?, parts.next()?);
    if parts.next().is_some() || patch.is_empty() || !patch.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    patch.parse().ok()
}

/// Where a minor is in its life, as the platform offers it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    /// New tenants get it only when they ask with `allow_preview`; never the default.
    Preview,
    /// The normal case.
    Supported,
    /// Still provisioned and upgraded to; its tenants should move on.
    Deprecated,
    /// No new tenants; the next fleet upgrade moves existing ones off it, opted out or not.
    Expired,
}

impl Class {
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Preview => "preview",
            Class::Supported => "supported",
            Class::Deprecated => "deprecated",
            Class::Expired => "expired",
        }
    }
}

/// Every supported minor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalog {
    pub default: String,
    pub versions: Vec<Version>,
}

/// Components every catalog entry must name an image for.
pub const COMPONENTS: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "coredns",
];

/// Why a catalog or a version request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    #[error("versions catalog is not valid YAML: {0}")]
    Yaml(String),
    #[error("versions catalog: minor {minor:?} has no image for {component}")]
    MissingImage { minor: String, component: String },
    #[error("versions catalog: release {kubernetes:?} does not belong to minor {minor:?}")]
    Mismatch { minor: String, kubernetes: String },
    #[error("versions catalog: default {0:?} is not one of its versions")]
    BadDefault(String),
    #[error("versions catalog: {0:?} is listed twice")]
    Duplicate(String),
    #[error(
        "versions catalog: the default {minor:?} is {class}; the default must be supported or deprecated"
    )]
    DefaultClass { minor: String, class: &'static str },
    #[error("versions catalog: {0:?} is not a minor like \"1.37\"")]
    BadMinor(String),
    #[error("version {minor} is expired: no new tenants; pick one of {supported}")]
    Expired { minor: String, supported: String },
    #[error("version {minor} is a preview: ask for it with allow_preview")]
    Preview { minor: String },
    #[error("unknown version {requested:?}; supported: {supported}")]
    Unknown {
        requested: String,
        supported: String,
    },
}

impl Catalog {
    /// The catalog shipped with this build.
    pub fn builtin() -> Catalog {
        Catalog::parse(include_str!("../../../templates/versions.yaml"))
            .expect("the built-in versions catalog is checked by tests")
    }

    /// Parses and checks a catalog.
    pub fn parse(yaml: &str) -> Result<Catalog, CatalogError> {
        let c: Catalog =
            serde_yaml::from_str(yaml).map_err(|e| CatalogError::Yaml(e.to_string()))?;
        let mut seen = std::collections::BTreeSet::new();
        for v in &c.versions {
            if minor_number(&v.minor).is_none() {
                return Err(CatalogError::BadMinor(v.minor.clone()));
            }
            if !seen.insert(&v.minor) {
                return Err(CatalogError::Duplicate(v.minor.clone()));
            }
            if !v
                .kubernetes
                .strip_prefix('v')
                .is_some_and(|r| r.starts_with(&format!("{}.", v.minor)))
            {
                return Err(CatalogError::Mismatch {
                    minor: v.minor.clone(),
                    kubernetes: v.kubernetes.clone(),
                });
            }
            let mut releases = std::collections::BTreeSet::new();
            for (r, _) in v.releases() {
                let ok = r
                    .strip_prefix('v')
                    .is_some_and(|r| r.starts_with(&format!("{}.", v.minor)))
                    && patch_number(r).is_some();
                if !ok {
                    return Err(CatalogError::Mismatch {
                        minor: v.minor.clone(),
                        kubernetes: r.to_owned(),
                    });
                }
                if !releases.insert(r) {
                    return Err(CatalogError::Duplicate(r.to_owned()));
                }
            }
            if let Some(c) = COMPONENTS.iter().find(|c| !v.images.contains_key(**c)) {
                return Err(CatalogError::MissingImage {
                    minor: v.minor.clone(),
                    component: (*c).to_owned(),
                });
            }
        }
        match c.versions.iter().find(|v| v.minor == c.default) {
            None => return Err(CatalogError::BadDefault(c.default.clone())),
            Some(v) if matches!(v.class, Class::Preview | Class::Expired) => {
                return Err(CatalogError::DefaultClass {
                    minor: v.minor.clone(),
                    class: v.class.as_str(),
                });
            }
            Some(_) => {}
        }
        Ok(c)
    }

    /// The version a new tenant gets, and its release: [`Catalog::resolve_release`], then the
    /// release's class: never `expired`, and `preview` only with `allow_preview`.
    pub fn resolve_new(
        &self,
        requested: Option<&str>,
        allow_preview: bool,
    ) -> Result<(&Version, &str), CatalogError> {
        let (v, release) = self.resolve_release(requested)?;
        let class = v
            .releases()
            .find(|(r, _)| *r == release)
            .map_or(v.class, |(_, c)| c);
        // The minor's own release is named by its minor; another patch by itself.
        let named = if release == v.kubernetes {
            v.minor.clone()
        } else {
            release[1..].to_owned()
        };
        match class {
            Class::Expired => Err(CatalogError::Expired {
                minor: named,
                supported: self.listed(|v| !matches!(v.class, Class::Expired | Class::Preview)),
            }),
            Class::Preview if !allow_preview => Err(CatalogError::Preview { minor: named }),
            _ => Ok((v, release)),
        }
    }

    /// The minors that pass `keep`, for messages.
    fn listed(&self, keep: impl Fn(&Version) -> bool) -> String {
        self.versions
            .iter()
            .filter(|v| keep(v))
            .map(|v| v.minor.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The version a request names: a minor (`1.37`, `v1.37`), one of its releases
    /// (`v1.37.1`, `1.37.1`, also a patch the entry lists), or nothing for the default.
    pub fn resolve(&self, requested: Option<&str>) -> Result<&Version, CatalogError> {
        self.resolve_release(requested).map(|(v, _)| v)
    }

    /// [`Catalog::resolve`], with the release the request names (a minor names its entry's
    /// `kubernetes`).
    pub fn resolve_release(
        &self,
        requested: Option<&str>,
    ) -> Result<(&Version, &str), CatalogError> {
        let Some(req) = requested else {
            let v = self
                .versions
                .iter()
                .find(|v| v.minor == self.default)
                .expect("checked by parse");
            return Ok((v, v.kubernetes.as_str()));
        };
        let bare = req.strip_prefix('v').unwrap_or(req);
        self.versions
            .iter()
            .find_map(|v| {
                if v.minor == bare {
                    return Some((v, v.kubernetes.as_str()));
                }
                v.releases()
                    .find(|(r, _)| *r == req || r[1..] == *bare)
                    .map(|(r, _)| (v, r))
            })
            .ok_or_else(|| CatalogError::Unknown {
                requested: req.to_owned(),
                supported: self.listed(|_| true),
            })
    }

    /// Every spelling [`Catalog::resolve`] takes, version by version: the minor (`1.37`), the
    /// minor with a `v`, each release (`v1.37.1`) and each release without its `v`.
    pub fn spellings(&self) -> Vec<String> {
        self.versions
            .iter()
            .flat_map(|v| {
                [v.minor.clone(), format!("v{}", v.minor)]
                    .into_iter()
                    .chain(
                        v.releases()
                            .flat_map(|(r, _)| [r.to_owned(), r[1..].to_owned()]),
                    )
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The entry of a minor as a tenant's release runs it ([`Version::at_release`]); the
    /// minor's own release when the tenant has none recorded, or one the catalog no longer
    /// lists (nothing else of that minor can be rendered).
    pub fn at_release(&self, minor: &str, release: Option<&str>) -> Option<Version> {
        let v = self.get(minor)?;
        Some(
            release
                .and_then(|r| v.at_release(r))
                .unwrap_or_else(|| v.clone()),
        )
    }

    /// The entry for a stored minor.
    pub fn get(&self, minor: &str) -> Option<&Version> {
        self.versions.iter().find(|v| v.minor == minor)
    }
}

/// The minor number of `"1.37"` (37); `None` for anything else.
pub fn minor_number(minor: &str) -> Option<u32> {
    let n = minor.strip_prefix("1.")?;
    // Digits only and no leading zero, so one minor has one spelling.
    (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && !(n.len() > 1 && n.starts_with('0')))
        .then(|| n.parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spellings_are_exactly_what_resolve_takes() {
        let c = Catalog::builtin();
        let spellings = c.spellings();
        assert_eq!(
            spellings,
            [
                "1.37", "v1.37", "v1.37.1", "1.37.1", "1.36", "v1.36", "v1.36.4", "1.36.4", "1.35",
                "v1.35", "v1.35.4", "1.35.4"
            ]
        );
        for s in &spellings {
            assert!(c.resolve(Some(s)).is_ok(), "{s}");
        }
        // Every string near a spelling: each one cut short, extended, or with a character
        // changed to another that versions use.
        for s in &spellings {
            for i in 0..=s.len() {
                for ch in ["", "v", "V", ".", "0", "1", "3", "7", " "] {
                    for cut in [0, 1] {
                        let near = format!("{}{ch}{}", &s[..i], &s[(i + cut).min(s.len())..]);
                        assert_eq!(
                            c.resolve(Some(&near)).is_ok(),
                            spellings.contains(&near),
                            "{near:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn builtin_catalog_has_the_three_minors_the_dev_cluster_builds() {
        let c = Catalog::builtin();
        assert_eq!(c.resolve(None).unwrap().minor, "1.37");
        assert_eq!(c.resolve(Some("1.36")).unwrap().kubernetes, "v1.36.4");
        assert_eq!(c.resolve(Some("v1.36")).unwrap().minor, "1.36");
        assert_eq!(c.resolve(Some("v1.37.1")).unwrap().minor, "1.37");
        assert_eq!(c.resolve(Some("1.37.1")).unwrap().minor, "1.37");
        assert_eq!(c.resolve(Some("1.35")).unwrap().kubernetes, "v1.35.4");
        let minors: Vec<u32> = c
            .versions
            .iter()
            .filter_map(|v| minor_number(&v.minor))
            .collect();
        assert_eq!(minors, [37, 36, 35], "the last three minors, newest first");
        // What tests/kube-bin builds: every release the catalog names.
        let build = include_str!("../../../tests/kube-bin/build.sh");
        for v in &c.versions {
            let dir = format!("\"k8s-v{}|", v.minor);
            assert!(build.contains(&dir), "tests/kube-bin builds no {}", v.minor);
        }
    }

    #[test]
    fn new_tenants_never_get_an_expired_minor_and_a_preview_only_on_request() {
        let ok = include_str!("../../../templates/versions.yaml");
        let c = Catalog::parse(&ok.replacen("class: deprecated", "class: expired", 1)).unwrap();
        assert_eq!(
            c.resolve_new(Some("1.35"), true).unwrap_err().to_string(),
            "version 1.35 is expired: no new tenants; pick one of 1.37, 1.36"
        );
        assert!(
            c.resolve(Some("1.35")).is_ok(),
            "existing tenants still resolve it"
        );
        let c = Catalog::parse(
            &ok.replacen("class: supported", "class: preview", 2)
                .replacen("class: preview", "class: supported", 1),
        )
        .unwrap();
        assert_eq!(c.get("1.36").unwrap().class, Class::Preview);
        assert_eq!(
            c.resolve_new(Some("1.36"), false).unwrap_err(),
            CatalogError::Preview {
                minor: "1.36".into()
            }
        );
        assert_eq!(c.resolve_new(Some("1.36"), true).unwrap().0.minor, "1.36");
        assert_eq!(c.resolve_new(None, false).unwrap().0.minor, "1.37");
        assert_eq!(
            c.resolve_new(Some("1.35"), false).unwrap().0.class,
            Class::Deprecated
        );
        // The default can be neither.
        for class in ["preview", "expired"] {
            assert!(matches!(
                Catalog::parse(&ok.replacen("class: supported", &format!("class: {class}"), 1))
                    .unwrap_err(),
                CatalogError::DefaultClass { .. }
            ));
        }
        assert!(matches!(
            Catalog::parse(&ok.replacen("class: supported", "class: retired", 1)).unwrap_err(),
            CatalogError::Yaml(_)
        ));
    }

    #[test]
    fn minor_numbers_have_one_spelling() {
        assert_eq!(minor_number("1.37"), Some(37));
        assert_eq!(minor_number("1.0"), Some(0));
        for bad in ["1.037", "2.37", "1.", "1.3a", "v1.37", "1.37.1", "", "1.-1"] {
            assert_eq!(minor_number(bad), None, "{bad}");
        }
    }

    #[test]
    fn unknown_versions_name_the_supported_ones() {
        let e = Catalog::builtin().resolve(Some("1.12")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown version \"1.12\"; supported: 1.37, 1.36, 1.35"
        );
        assert!(Catalog::builtin().resolve(Some("v1.37.9")).is_err());
        assert!(Catalog::builtin().resolve(Some("")).is_err());
    }

    #[test]
    fn broken_catalogs_are_refused_with_a_reason() {
        let ok = include_str!("../../../templates/versions.yaml");
        assert!(matches!(
            Catalog::parse("versions: [").unwrap_err(),
            CatalogError::Yaml(_)
        ));
        assert_eq!(
            Catalog::parse(&ok.replace("default: \"1.37\"", "default: \"1.99\"")).unwrap_err(),
            CatalogError::BadDefault("1.99".into())
        );
        assert!(matches!(
            Catalog::parse(&ok.replace("kubernetes: v1.36.4", "kubernetes: v1.35.0")).unwrap_err(),
            CatalogError::Mismatch { .. }
        ));
        assert!(matches!(
            Catalog::parse(&ok.replacen(
                "      coredns: registry.k8s.io/coredns/coredns:v1.15.0\n",
                "",
                1
            ))
            .unwrap_err(),
            CatalogError::MissingImage { .. }
        ));
        assert_eq!(
            Catalog::parse(&ok.replace("minor: \"1.36\"", "minor: \"1.37\"")).unwrap_err(),
            CatalogError::Duplicate("1.37".into())
        );
    }

    /// The built-in catalog with a patch list on 1.37: an older release and a newer preview.
    pub(crate) fn with_patches() -> Catalog {
        let ok = include_str!("../../../templates/versions.yaml");
        Catalog::parse(&ok.replacen(
            "controller_manager_flags: []",
            "controller_manager_flags: []
    patches:
      - kubernetes: v1.37.0
        images:
          kube-apiserver: registry.k8s.io/kube-apiserver:v1.37.0
      - kubernetes: v1.37.2
        class: preview",
            1,
        ))
        .unwrap()
    }

    #[test]
    fn a_minor_lists_other_releases_and_renders_each_with_its_images() {
        let c = with_patches();
        let v = c.get("1.37").unwrap();
        assert_eq!(
            v.releases().collect::<Vec<_>>(),
            [
                ("v1.37.1", Class::Supported),
                ("v1.37.0", Class::Supported),
                ("v1.37.2", Class::Preview)
            ]
        );
        let old = c.at_release("1.37", Some("v1.37.0")).unwrap();
        assert_eq!(old.kubernetes, "v1.37.0");
        assert_eq!(
            old.images["kube-apiserver"],
            "registry.k8s.io/kube-apiserver:v1.37.0"
        );
        assert_eq!(
            old.images["kube-controller-manager"],
            "registry.k8s.io/kube-controller-manager:v1.37.1",
            "a component the patch does not name keeps the minor's image"
        );
        // No release, or one the catalog dropped: the minor's own.
        assert_eq!(c.at_release("1.37", None).unwrap().kubernetes, "v1.37.1");
        assert_eq!(
            c.at_release("1.37", Some("v1.37.9")).unwrap().kubernetes,
            "v1.37.1"
        );
        assert!(c.at_release("1.12", None).is_none());
        // New tenants may ask for a listed release; a preview one only with allow_preview.
        let (v, r) = c.resolve_new(Some("1.37.0"), false).unwrap();
        assert_eq!((v.minor.as_str(), r), ("1.37", "v1.37.0"));
        assert_eq!(
            c.resolve_new(Some("v1.37.2"), false).unwrap_err(),
            CatalogError::Preview {
                minor: "1.37.2".into()
            }
        );
        assert_eq!(c.resolve_new(Some("v1.37.2"), true).unwrap().1, "v1.37.2");
        assert_eq!(c.resolve_new(Some("1.37"), false).unwrap().1, "v1.37.1");
        for s in c.spellings() {
            assert!(c.resolve(Some(&s)).is_ok(), "{s}");
        }
        assert!(c.spellings().contains(&"1.37.0".to_owned()));
        // A patch of another minor, a release listed twice, a field the catalog does not know.
        let ok = include_str!("../../../templates/versions.yaml");
        let patched = |p: &str| {
            Catalog::parse(&ok.replacen(
                "controller_manager_flags: []",
                &format!("controller_manager_flags: []\n    patches:\n{p}"),
                1,
            ))
        };
        assert!(matches!(
            patched("      - kubernetes: v1.36.9").unwrap_err(),
            CatalogError::Mismatch { .. }
        ));
        assert_eq!(
            patched("      - kubernetes: v1.37.1").unwrap_err(),
            CatalogError::Duplicate("v1.37.1".into())
        );
        assert!(matches!(
            patched("      - kubernetes: v1.37.3\n        flags: []").unwrap_err(),
            CatalogError::Yaml(_)
        ));
        assert_eq!(patch_number("v1.37.12"), Some(12));
        for bad in ["1.37.1", "v1.37", "v1.37.x", "v1.37.1.1", "v2.37.1"] {
            assert_eq!(patch_number(bad), None, "{bad}");
        }
    }
}
