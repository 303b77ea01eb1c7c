//! Container images for the real node, written here: no registry, no image builder daemon.
//!
//! Data flow: [`test_images`] says what each image holds (files from the binary cache that
//! `tests/kube-bin/build.sh` fills, and from Debian packages); [`Image::archive`] writes one as
//! a docker-archive tar (pure: the entries in, bytes out); [`crate::node`] imports the
//! archives into the node's containerd under the names pods use, so `IfNotPresent` pulls find
//! them and nothing is ever fetched.
//!
//! Why a writer of our own: an image here is one layer of a few files we already have, which
//! takes a tar writer and two JSON documents. buildah or a registry would add a daemon or a
//! second toolchain to every machine for that. Why docker-archive rather than an OCI layout:
//! `ctr images import` names a docker archive's image from its `RepoTags` with no extra flag,
//! and the archive is as reproducible (every timestamp is zero, entries keep their order).

use crate::{Error, Result, bins};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// The pod sandbox image: what containerd's `pinned_images.sandbox` names.
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10.2";
/// A shell and the usual tools (Debian's `busybox-static`), for test pods.
pub const BUSYBOX_IMAGE: &str = "vcp.dev/busybox:1.35";
/// Where Debian's `busybox-static` installs its binary.
const BUSYBOX_BIN: &str = "/bin/busybox";

/// One entry of an image's only layer. Paths are relative to the root (`bin/sh`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Dir {
        path: String,
        mode: u32,
    },
    File {
        path: String,
        mode: u32,
        data: Vec<u8>,
    },
    Symlink {
        path: String,
        target: String,
    },
}

/// An image of one layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// The name pods use, `registry/repository:tag`.
    pub reference: String,
    /// More names for the same image (vcp's images go by their dev name and their release
    /// name).
    pub also: Vec<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub env: Vec<String>,
    pub entries: Vec<Entry>,
}

impl Image {
    /// Gives the image each of `names` it does not go by yet.
    pub fn name_also(&mut self, names: impl IntoIterator<Item = String>) {
        for n in names {
            if n != self.reference && !self.also.contains(&n) {
                self.also.push(n);
            }
        }
    }

    /// The image as a docker-archive tar: `manifest.json`, the config named by its digest,
    /// and the layer. The same image always gives the same bytes.
    pub fn archive(&self) -> Result<Vec<u8>> {
        let layer = self.layer()?;
        let layer_digest = sha256_hex(&layer);
        let config = serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Entrypoint": none_if_empty(&self.entrypoint),
                "Cmd": none_if_empty(&self.cmd),
                "Env": self.env,
            },
            "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
        });
        let config = serde_json::to_vec(&config).map_err(|e| Error::Image(e.to_string()))?;
        let config_name = format!("{}.json", sha256_hex(&config));
        let layer_name = format!("{layer_digest}/layer.tar");
        let manifest = serde_json::json!([{
            "Config": config_name,
            "RepoTags": std::iter::once(&self.reference).chain(&self.also).collect::<Vec<_>>(),
            "Layers": [layer_name],
        }]);
        let manifest = serde_json::to_vec(&manifest).map_err(|e| Error::Image(e.to_string()))?;
        let mut out = tar::Builder::new(Vec::new());
        append(&mut out, &Entry::file(&config_name, 0o644, config))?;
        append(&mut out, &Entry::dir(&layer_digest, 0o755))?;
        append(&mut out, &Entry::file(&layer_name, 0o644, layer))?;
        append(&mut out, &Entry::file("manifest.json", 0o644, manifest))?;
        out.into_inner().map_err(|e| Error::Image(e.to_string()))
    }

    fn layer(&self) -> Result<Vec<u8>> {
        let mut b = tar::Builder::new(Vec::new());
        for e in &self.entries {
            append(&mut b, e)?;
        }
        b.into_inner().map_err(|e| Error::Image(e.to_string()))
    }
}

impl Entry {
    pub fn dir(path: &str, mode: u32) -> Entry {
        Entry::Dir {
            path: path.to_owned(),
            mode,
        }
    }

    pub fn file(path: &str, mode: u32, data: Vec<u8>) -> Entry {
        Entry::File {
            path: path.to_owned(),
            mode,
            data,
        }
    }

    pub fn symlink(path: &str, target: &str) -> Entry {
        Entry::Symlink {
            path: path.to_owned(),
            target: target.to_owned(),
        }
    }
}

fn none_if_empty(v: &[String]) -> serde_json::Value {
    if v.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::json!(v)
    }
}

fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn append(b: &mut tar::Builder<Vec<u8>>, e: &Entry) -> Result<()> {
    let mut h = tar::Header::new_ustar();
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    let res = match e {
        Entry::Dir { path, mode } => {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(*mode);
            h.set_size(0);
            b.append_data(&mut h, path, std::io::empty())
        }
        Entry::File { path, mode, data } => {
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(*mode);
            h.set_size(data.len() as u64);
            b.append_data(&mut h, path, data.as_slice())
        }
        Entry::Symlink { path, target } => {
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_mode(0o777);
            h.set_size(0);
            b.append_link(&mut h, path, target)
        }
    };
    res.map_err(|err| Error::Image(format!("tar entry {e:?}: {err}")))
}

/// The pause image: the statically linked `pause` from the binary cache, as its entrypoint.
pub fn pause(pause_bin: &[u8]) -> Image {
    Image {
        reference: PAUSE_IMAGE.to_owned(),
        also: Vec::new(),
        entrypoint: vec!["/pause".to_owned()],
        cmd: Vec::new(),
        env: Vec::new(),
        entries: vec![Entry::file("pause", 0o755, pause_bin.to_vec())],
    }
}

/// The busybox image: the static binary and a link per applet in `/bin`, `sh` by default.
pub fn busybox(busybox_bin: &[u8], applets: &[&str]) -> Image {
    Image {
        reference: BUSYBOX_IMAGE.to_owned(),
        also: Vec::new(),
        entrypoint: Vec::new(),
        cmd: vec!["sh".to_owned()],
        env: vec!["PATH=/bin".to_owned()],
        entries: busybox_entries(busybox_bin, applets),
    }
}

/// The agnhost image as the conformance suite names and runs it: `/agnhost` (and its alias
/// `/agnhost-2`) as the entrypoint with `pause` as the command, the users and groups the
/// suite expects of it, `/uploads`, and porter's certificate and key. The shell and tools that
/// its Alpine base gives come from busybox here, and `tools` (name in `/usr/bin`, file on this
/// machine) add the ones busybox's applets do not stand in for: the suite runs `dig`, `curl`
/// and OpenBSD's `nc -v -z` inside agnhost pods. Dynamic libraries of every binary come along.
pub fn agnhost(
    tag: &str,
    agnhost_bin: &Path,
    busybox_bin: &[u8],
    applets: &[&str],
    porter: (Vec<u8>, Vec<u8>),
    tools: &[(&str, PathBuf)],
) -> Result<Image> {
    let mut entries: Vec<Entry> = busybox_entries(busybox_bin, applets)
        .into_iter()
        .filter(|e| !matches!(e, Entry::File { path, .. } if path.starts_with("etc/")))
        .collect();
    entries.extend([
        Entry::file(
            "etc/passwd",
            0o644,
            b"root:x:0:0:root:/root:/bin/sh\nuser-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n".to_vec(),
        ),
        Entry::file(
            "etc/group",
            0o644,
            b"root:x:0:\nuser-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\nnogroup:x:65534:\n".to_vec(),
        ),
        // Name lookups as musl makes them in the upstream image: the hosts file, then DNS.
        Entry::file("etc/nsswitch.conf", 0o644, NSSWITCH.to_vec()),
        Entry::dir("uploads", 0o777),
        Entry::file("localhost.crt", 0o644, porter.0),
        Entry::file("localhost.key", 0o600, porter.1),
        Entry::file(
            "agnhost",
            0o755,
            std::fs::read(agnhost_bin).map_err(Error::io(agnhost_bin))?,
        ),
        Entry::symlink("agnhost-2", "agnhost"),
    ]);
    for (name, host) in tools {
        let data = std::fs::read(host).map_err(Error::io(host))?;
        add_file(&mut entries, &Path::new("/usr/bin").join(name), 0o755, data);
    }
    let mut elves = vec![agnhost_bin.to_owned()];
    elves.extend(tools.iter().map(|(_, h)| h.clone()));
    add_libraries(&mut entries, &elves, None)?;
    Ok(Image {
        reference: format!("{AGNHOST_REPOSITORY}:{tag}"),
        also: Vec::new(),
        entrypoint: vec!["/agnhost".to_owned()],
        cmd: vec!["pause".to_owned()],
        env: vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned()],
        entries,
    })
}

/// An image of the update demo (`reference`, the suite's `nautilus` or `kitten`): `agnhost`
/// with `files` at `/`, running `agnhost test-webserver`, which serves `/` on port 80.
pub fn update_demo(agnhost: &Image, reference: &str, files: Vec<(String, Vec<u8>)>) -> Image {
    let mut img = agnhost.clone();
    img.reference = reference.to_owned();
    img.also = Vec::new();
    img.cmd = vec!["test-webserver".to_owned()];
    img.entries.extend(
        files
            .into_iter()
            .map(|(name, data)| Entry::file(&name, 0o644, data)),
    );
    img
}

/// The repository the conformance suite pulls agnhost from.
pub const AGNHOST_REPOSITORY: &str = "registry.k8s.io/e2e-test-images/agnhost";

/// busybox in `/bin` with a link per applet, `/tmp`, and the users `id` and `ls -l` look up.
fn busybox_entries(busybox_bin: &[u8], applets: &[&str]) -> Vec<Entry> {
    let mut entries = vec![
        Entry::dir("bin", 0o755),
        Entry::file("bin/busybox", 0o755, busybox_bin.to_vec()),
        Entry::dir("tmp", 0o1777),
        Entry::dir("etc", 0o755),
        // What `id`, `ls -l` and a non-root `runAsUser` look names up in.
        Entry::file(
            "etc/passwd",
            0o644,
            b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n".to_vec(),
        ),
        Entry::file(
            "etc/group",
            0o644,
            b"root:x:0:\nnogroup:x:65534:\n".to_vec(),
        ),
    ];
    let mut applets: Vec<&str> = applets
        .iter()
        .copied()
        .filter(|a| *a != "busybox" && !a.is_empty() && !a.contains('/'))
        .collect();
    applets.sort_unstable();
    applets.dedup();
    entries.extend(
        applets
            .into_iter()
            .map(|a| Entry::symlink(&format!("bin/{a}"), "busybox")),
    );
    entries
}

/// Where the Kubernetes module of the default minor keeps agnhost's source: its `VERSION`
/// (the image's tag) and porter's certificate.
fn agnhost_source() -> Result<PathBuf> {
    let out = std::process::Command::new("go")
        .args(["env", "GOMODCACHE"])
        .output()
        .map_err(Error::io("go env GOMODCACHE"))?;
    let cache = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let dir = Path::new(&cache)
        .join(format!(
            "k8s.io/kubernetes@{}",
            bins::host_kubernetes_version()
        ))
        .join("test/images/agnhost");
    if dir.join("VERSION").is_file() {
        Ok(dir)
    } else {
        Err(Error::Image(format!(
            "agnhost's source is not in the Go module cache ({}); tests/kube-bin/build.sh fetches it",
            dir.display()
        )))
    }
}

/// agnhost's tag: the `VERSION` in its source, as the suite of the default minor names it.
pub fn agnhost_tag() -> Result<String> {
    let p = agnhost_source()?.join("VERSION");
    let v = std::fs::read_to_string(&p).map_err(Error::io(&p))?;
    Ok(v.trim().to_owned())
}

/// The images every real node gets: pause, busybox and agnhost, from the binary cache, the Go
/// module cache and Debian.
pub fn test_images() -> Result<Vec<Image>> {
    let pause_path = pause_binary()?;
    let pause_bin = std::fs::read(&pause_path).map_err(Error::io(&pause_path))?;
    let bb = Path::new(BUSYBOX_BIN);
    let busybox_bin = std::fs::read(bb).map_err(|_| {
        Error::Image(format!(
            "{BUSYBOX_BIN} is missing: install Debian's busybox-static (tests/setup.sh does)"
        ))
    })?;
    let out = std::process::Command::new(bb)
        .arg("--list")
        .output()
        .map_err(Error::io(bb))?;
    let list = String::from_utf8_lossy(&out.stdout);
    let applets: Vec<&str> = list.split_whitespace().collect();
    let src = agnhost_source()?;
    let read = |p: PathBuf| std::fs::read(&p).map_err(Error::io(p));
    let agnhost = agnhost(
        &agnhost_tag()?,
        &bins::binary("agnhost", bins::host_kubernetes_version())?,
        &busybox_bin,
        &applets,
        (
            read(src.join("porter/localhost.crt"))?,
            read(src.join("porter/localhost.key"))?,
        ),
        &agnhost_tools()?,
    )?;
    let mut busybox = busybox(&busybox_bin, &applets);
    let mut agnhost = agnhost;
    with_shell(&mut busybox, Path::new(SHELL))?;
    with_shell(&mut agnhost, Path::new(SHELL))?;
    // The names the conformance suites give the same images, so their pods find them on the
    // node (nothing is pulled here): the default minor's, and those of every other supported
    // minor whose module is in the Go module cache (an older suite's pods name older tags).
    let manifests = supported_manifests(&src)?;
    let named = |id: &str| names_of(&manifests, id);
    busybox.name_also(named("BusyBox"));
    agnhost.name_also(named("Agnhost").into_iter().chain(named("AgnhostPrev")));
    let mut web: Vec<String> = Vec::new();
    for r in ["Nginx", "NginxNew"].iter().flat_map(|id| named(id)) {
        if !web.contains(&r) {
            web.push(r);
        }
    }
    // The update demo's two web servers, as the suite's own Dockerfiles make them: agnhost
    // serving a picture and `data.json` from `/`.
    let mut demos = Vec::new();
    for (id, dir) in [("Nautilus", "nautilus"), ("Kitten", "kitten")] {
        let mut names = named(id).into_iter();
        let Some(name) = names.next() else { continue };
        let html = src.join("..").join(dir).join("html");
        let files = [format!("{dir}.jpg"), "data.json".to_owned()]
            .into_iter()
            .map(|f| Ok((f.clone(), read(html.join(&f))?)))
            .collect::<Result<Vec<_>>>()?;
        let mut demo = update_demo(&agnhost, &name, files);
        demo.name_also(names);
        demos.push(demo);
    }
    let mut images = vec![
        pause(&pause_bin),
        busybox,
        agnhost,
        web_server(&busybox_bin, &applets, web),
    ];
    images.extend(demos);
    let mut probers = named("GlibcDnsTesting").into_iter();
    if let Some(name) = probers.next() {
        let dig = agnhost_tools()?
            .into_iter()
            .find(|(n, _)| *n == "dig")
            .map(|(_, p)| p)
            .unwrap_or_default();
        let mut prober = dns_prober(
            &name,
            &busybox_bin,
            &applets,
            &[("dig", dig), ("getent", PathBuf::from(GETENT))],
        )?;
        prober.name_also(probers);
        images.push(prober);
    }
    Ok(images)
}

/// The image manifests of the supported minors' suites, the default minor's first: each
/// `test/utils/image/manifest.go` found in the Go module cache beside `agnhost_src` (the
/// default minor's agnhost source). A minor whose module is not fetched is left out: its
/// suite is not built either.
fn supported_manifests(agnhost_src: &Path) -> Result<Vec<Vec<(String, String)>>> {
    let modules = agnhost_src.join("../../../..");
    let mut out = Vec::new();
    for version in bins::supported_kubernetes_versions() {
        let p = modules.join(format!("kubernetes@{version}/test/utils/image/manifest.go"));
        match std::fs::read_to_string(&p) {
            Ok(src) => out.push(e2e_manifest(&src)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&p)(e)),
        }
    }
    Ok(out)
}

/// Every reference the manifests give image `id`, in manifest order, each once.
pub fn names_of(manifests: &[Vec<(String, String)>], id: &str) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for m in manifests {
        for (i, r) in m {
            if i == id && !names.contains(r) {
                names.push(r.clone());
            }
        }
    }
    names
}

/// The tools agnhost's Alpine base has and busybox does not stand in for, from Debian: `dig`
/// (bind9-dnsutils), `curl`, OpenBSD's `nc` (netcat-openbsd; busybox's `nc` lacks `-z`
/// and `-v` as the suite uses them), and `getent` (the DNS tests' "musl" prober runs
/// `getent hosts` in agnhost; glibc's, resolving through the image's `/etc/nsswitch.conf`
/// as musl does: the hosts file, then DNS). tests/setup.sh installs them.
pub const AGNHOST_TOOLS: [(&str, &str, &str); 4] = [
    ("dig", "/usr/bin/dig", "bind9-dnsutils"),
    ("curl", "/usr/bin/curl", "curl"),
    ("nc", "/usr/bin/nc.openbsd", "netcat-openbsd"),
    ("getent", GETENT, "libc-bin"),
];

/// The shell of the busybox and agnhost images (`/bin/sh`): Debian's bash (essential, always
/// there), not Debian's busybox shell, which the suite's commands tell apart from the upstream
/// images' busybox shell in two ways. It runs its own applets ahead of `PATH`, so `nc` in it is
/// busybox's (no `-v`) whatever `PATH` says. And it drops environment variables whose names
/// are not shell names (`data-1`), which a pod's env may hold and `sh -c env` must print.
pub const SHELL: &str = "/usr/bin/bash";

/// Makes the shell at `host` (a file of this machine) the image's `/bin/sh`, in place of
/// busybox's, as `/usr/bin/sh` with the libraries it loads.
pub fn with_shell(image: &mut Image, host: &Path) -> Result<()> {
    let data = std::fs::read(host).map_err(Error::io(host))?;
    let entries = &mut image.entries;
    add_file(entries, Path::new("/usr/bin/sh"), 0o755, data);
    entries.retain(|e| !matches!(e, Entry::Symlink { path, .. } if path == "bin/sh"));
    entries.push(Entry::symlink("bin/sh", "/usr/bin/sh"));
    add_libraries(entries, &[host.to_owned()], None)
}

fn agnhost_tools() -> Result<Vec<(&'static str, PathBuf)>> {
    AGNHOST_TOOLS
        .iter()
        .map(|(name, path, package)| {
            let p = PathBuf::from(path);
            if p.is_file() {
                Ok((*name, p))
            } else {
                Err(Error::Image(format!(
                    "{path} is missing: install Debian's {package} (tests/setup.sh does)"
                )))
            }
        })
        .collect()
}

/// The images the conformance suite names, as (its id, `registry/name:tag`), read from the
/// suite's `test/utils/image/manifest.go` (`configs[Id] = Config{list.Registry, "name",
/// "tag"}`) with the default registries it declares there (`Registry: "..."`).
pub fn e2e_manifest(src: &str) -> Vec<(String, String)> {
    let registry = |key: &str| -> Option<&str> {
        let line = src
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{key}:")))?;
        line.split('"').nth(1)
    };
    src.lines()
        .filter_map(|l| {
            let l = l.trim();
            let id = l.strip_prefix("configs[")?.split(']').next()?;
            let body = l.split_once("Config{")?.1;
            let reg_key = body.split(',').next()?.trim().strip_prefix("list.")?;
            let mut quoted = body.split('"').skip(1).step_by(2);
            let (name, tag) = (quoted.next()?, quoted.next()?);
            Some((
                id.to_owned(),
                format!("{}/{name}:{tag}", registry(reg_key)?),
            ))
        })
        .collect()
}

/// A stand-in for the suite's web server images (nginx): busybox's httpd serving a page on
/// port 80 as nginx's image does by default. The suite's tests only need a container that
/// runs and answers HTTP on 80; nothing is built from nginx.
pub fn web_server(busybox_bin: &[u8], applets: &[&str], names: Vec<String>) -> Image {
    let mut entries = busybox_entries(busybox_bin, applets);
    entries.extend([
        Entry::dir("usr", 0o755),
        Entry::dir("usr/share", 0o755),
        Entry::dir("usr/share/nginx", 0o755),
        Entry::dir("usr/share/nginx/html", 0o755),
        Entry::file(
            "usr/share/nginx/html/index.html",
            0o644,
            b"<html><body>Welcome to nginx (a busybox stand-in built by vcp-dev)</body></html>\n"
                .to_vec(),
        ),
    ]);
    let mut names = names.into_iter();
    Image {
        reference: names.next().unwrap_or_else(|| WEB_SERVER_IMAGE.to_owned()),
        also: names.collect(),
        entrypoint: Vec::new(),
        cmd: ["httpd", "-f", "-p", "80", "-h", "/usr/share/nginx/html"]
            .map(str::to_owned)
            .to_vec(),
        env: vec!["PATH=/bin".to_owned()],
        entries,
    }
}

/// A stand-in for the suite's DNS prober image (`glibc-dns-testing`, Debian with dnsutils):
/// busybox for the shell and `seq`, `dig` (from `tools`) and glibc's `getent` (resolving as
/// glibc does, through `/etc/nsswitch.conf`: the hosts file, then DNS), each with its
/// libraries. Named `reference` (the suite's name for it).
pub fn dns_prober(
    reference: &str,
    busybox_bin: &[u8],
    applets: &[&str],
    tools: &[(&str, PathBuf)],
) -> Result<Image> {
    let mut entries = busybox_entries(busybox_bin, applets);
    entries.push(Entry::file("etc/nsswitch.conf", 0o644, NSSWITCH.to_vec()));
    for (name, host) in tools {
        let data = std::fs::read(host).map_err(Error::io(host))?;
        add_file(&mut entries, &Path::new("/usr/bin").join(name), 0o755, data);
    }
    let elves: Vec<PathBuf> = tools.iter().map(|(_, h)| h.clone()).collect();
    add_libraries(&mut entries, &elves, None)?;
    Ok(Image {
        reference: reference.to_owned(),
        also: Vec::new(),
        entrypoint: Vec::new(),
        cmd: vec!["/bin/sh".to_owned()],
        env: vec!["PATH=/usr/bin:/bin".to_owned()],
        entries,
    })
}

/// Where glibc's `getent` is on this machine (Debian's libc-bin, always installed).
const GETENT: &str = "/usr/bin/getent";

/// glibc's name service order in the images that resolve with it: the hosts file, then DNS
/// (without the file, glibc asks DNS first and stops at its "not found").
const NSSWITCH: &[u8] = b"hosts: files dns\n";

/// The web server stand-in's name when the suite's manifest names no nginx.
pub const WEB_SERVER_IMAGE: &str = "vcp.dev/web-server:1";

/// An image of one static binary from the binary cache, its entrypoint (`/<name>`).
pub fn static_binary(reference: &str, name: &str, bin: &[u8]) -> Image {
    Image {
        reference: reference.to_owned(),
        also: Vec::new(),
        entrypoint: vec![format!("/{name}")],
        cmd: Vec::new(),
        env: Vec::new(),
        entries: vec![Entry::file(name, 0o755, bin.to_vec())],
    }
}

/// The NetworkPolicy enforcer's image, named by its pinned version.
pub fn network_policy_image() -> String {
    format!(
        "vcp.dev/kube-network-policies:{}",
        bins::tool_version("kube-network-policies").unwrap_or("unknown")
    )
}

/// CoreDNS's image by the catalog's name for the pinned version: the host cluster's DNS on
/// the real node, and every tenant's.
pub fn coredns_image() -> String {
    format!(
        "registry.k8s.io/coredns/coredns:{}",
        bins::tool_version("coredns").unwrap_or("unknown")
    )
}

/// Every image the real node gets at start: [`test_images`], the node's own NetworkPolicy
/// enforcer and CoreDNS (the host cluster's DNS).
pub fn node_images() -> Result<Vec<Image>> {
    let mut imgs = test_images()?;
    let path = bins::tool("kube-network-policies")?;
    let bin = std::fs::read(&path).map_err(Error::io(&path))?;
    imgs.push(static_binary(
        &network_policy_image(),
        "kube-network-policies",
        &bin,
    ));
    imgs.push(from_binaries(
        &coredns_image(),
        &[("coredns", bins::tool("coredns")?)],
        Vec::new(),
        Vec::new(),
    )?);
    Ok(imgs)
}

/// The shared libraries `ldd` lists for a binary, the loader included (pure: its output in).
/// An empty list for a static binary.
pub fn ldd_libraries(ldd_output: &str) -> Vec<PathBuf> {
    ldd_output
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
            let path = match l.split_once("=>") {
                Some((_, rest)) => rest.trim(),
                None => l,
            };
            let path = path.split(" (").next()?.trim();
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// distroless's users: root and `nonroot` (65532), which vcp's templates run as.
const DISTROLESS_USERS: (&str, &str) = (
    "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
    "root:x:0:\nnonroot:x:65532:\n",
);

/// What every image of binaries holds besides them: its users (`/etc/passwd` and
/// `/etc/group` lines), `/tmp`, and `/home/nonroot`.
fn base_entries((passwd, group): (&str, &str)) -> Vec<Entry> {
    vec![
        Entry::dir("etc", 0o755),
        Entry::file("etc/passwd", 0o644, passwd.as_bytes().to_vec()),
        Entry::file("etc/group", 0o644, group.as_bytes().to_vec()),
        Entry::dir("tmp", 0o1777),
        Entry::dir("home", 0o755),
        Entry::dir("home/nonroot", 0o700),
    ]
}

/// Adds each directory of `dir` (relative), outermost first, that `entries` lacks.
fn add_dirs(entries: &mut Vec<Entry>, dir: &Path, mode: u32) {
    let mut at = PathBuf::new();
    for c in dir.components() {
        at.push(c);
        let d = at.to_string_lossy().into_owned();
        if !entries
            .iter()
            .any(|e| matches!(e, Entry::Dir { path, .. } if *path == d))
        {
            entries.push(Entry::dir(&d, mode));
        }
    }
}

/// Adds `path` (absolute) with its parent directories, once each.
fn add_file(entries: &mut Vec<Entry>, path: &Path, mode: u32, data: Vec<u8>) {
    let rel = path.strip_prefix("/").unwrap_or(path);
    if let Some(parent) = rel.parent() {
        add_dirs(entries, parent, 0o755);
    }
    entries.push(Entry::file(&rel.to_string_lossy(), mode, data));
}

/// Adds, once each, the shared libraries the ELF files `elves` load (as `ldd` lists them, at
/// the same paths), except those under `skip` and those the image holds already.
fn add_libraries(entries: &mut Vec<Entry>, elves: &[PathBuf], skip: Option<&Path>) -> Result<()> {
    let mut libs: Vec<PathBuf> = Vec::new();
    for e in elves {
        let out = std::process::Command::new("ldd")
            .arg(e)
            .output()
            .map_err(Error::io("ldd"))?;
        for l in ldd_libraries(&String::from_utf8_lossy(&out.stdout)) {
            if !libs.contains(&l) && !skip.is_some_and(|s| l.starts_with(s)) {
                libs.push(l);
            }
        }
    }
    for l in &libs {
        let rel = l
            .strip_prefix("/")
            .unwrap_or(l)
            .to_string_lossy()
            .into_owned();
        if entries
            .iter()
            .any(|e| matches!(e, Entry::File { path, .. } if *path == rel))
        {
            continue;
        }
        let data = std::fs::read(l).map_err(Error::io(l))?;
        add_file(entries, l, 0o755, data);
    }
    Ok(())
}

/// An image of executables from this machine in `/usr/local/bin` (on `PATH`), with the
/// shared libraries they load at the paths `ldd` names and distroless's users. Debug
/// information is stripped on the way in (the workspace's debug builds are mostly that).
pub fn from_binaries(
    reference: &str,
    binaries: &[(&str, PathBuf)],
    entrypoint: Vec<String>,
    cmd: Vec<String>,
) -> Result<Image> {
    let mut entries = base_entries(DISTROLESS_USERS);
    for (name, host) in binaries {
        add_file(
            &mut entries,
            &Path::new("/usr/local/bin").join(name),
            0o755,
            stripped(host)?,
        );
    }
    let hosts: Vec<PathBuf> = binaries.iter().map(|(_, h)| h.clone()).collect();
    add_libraries(&mut entries, &hosts, None)?;
    // TLS clients that fall back on the system's roots find them where distroless has them.
    let roots = Path::new("/etc/ssl/certs/ca-certificates.crt");
    if let Ok(data) = std::fs::read(roots) {
        add_file(&mut entries, roots, 0o644, data);
    }
    Ok(Image {
        reference: reference.to_owned(),
        also: Vec::new(),
        entrypoint,
        cmd,
        env: vec!["PATH=/usr/local/bin:/usr/bin:/bin".to_owned()],
        entries,
    })
}

/// The binary's bytes without debug information (`strip --strip-debug` into a temporary
/// file); the binary itself when `strip` fails.
fn stripped(path: &Path) -> Result<Vec<u8>> {
    let tmp = tempfile::NamedTempFile::new().map_err(Error::io(std::env::temp_dir()))?;
    let ok = std::process::Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(tmp.path())
        .arg(path)
        .status()
        .is_ok_and(|s| s.success());
    let from = if ok { tmp.path() } else { path };
    std::fs::read(from).map_err(Error::io(from))
}

/// The catalog's control-plane images (`templates/versions.yaml`) for every minor whose
/// binaries are built, as the templates run them: the component's binary on `PATH` (etcd's
/// image also holds etcdctl and etcdutl, as the real one does). Returns the images and the
/// references it skipped (a minor not built here).
pub fn control_plane_images(catalog_yaml: &str) -> Result<(Vec<Image>, Vec<String>)> {
    #[derive(serde::Deserialize)]
    struct Catalog {
        versions: Vec<Version>,
    }
    #[derive(serde::Deserialize)]
    struct Version {
        kubernetes: String,
        images: std::collections::BTreeMap<String, String>,
    }
    let catalog: Catalog = serde_yaml::from_str(catalog_yaml)
        .map_err(|e| Error::Image(format!("versions catalog: {e}")))?;
    let (mut out, mut skipped) = (Vec::new(), Vec::new());
    let mut seen = std::collections::BTreeSet::new();
    for v in &catalog.versions {
        for (component, reference) in &v.images {
            if !seen.insert(reference.clone()) {
                continue;
            }
            let binaries: Vec<(&str, Result<PathBuf>)> = match component.as_str() {
                "etcd" => ["etcd", "etcdctl", "etcdutl"]
                    .into_iter()
                    .map(|b| (b, bins::tool(b)))
                    .collect(),
                "coredns" => vec![("coredns", bins::tool("coredns"))],
                c @ ("kube-apiserver" | "kube-controller-manager") => {
                    vec![(c, bins::binary(c, &v.kubernetes))]
                }
                other => {
                    return Err(Error::Image(format!(
                        "versions catalog names an image for {other:?}, which the real node does not build"
                    )));
                }
            };
            if binaries.iter().any(|(_, b)| b.is_err()) {
                skipped.push(reference.clone());
                continue;
            }
            let binaries: Vec<(&str, PathBuf)> = binaries
                .into_iter()
                .filter_map(|(n, b)| Some((n, b.ok()?)))
                .collect();
            out.push(from_binaries(reference, &binaries, Vec::new(), Vec::new())?);
        }
    }
    Ok((out, skipped))
}

/// vcp's own images, by the recipe of `orchestrator/Dockerfile`, `syncer/Dockerfile` and
/// `gateway/Dockerfile`: the
/// binary at `/usr/local/bin`, the user 65532, the same entrypoint and command. The binary is
/// the workspace's build next to `bin_dir` (a glibc build, so its libraries come along where
/// the Dockerfiles' static musl build needs none). Named by the dev names the dev platform
/// configures and by the release names the Dockerfiles give.
pub fn vcp_images(bin_dir: &Path, release: &str) -> Result<Vec<Image>> {
    let bin = |name: &str| {
        let p = bin_dir.join(name);
        if p.is_file() {
            Ok(p)
        } else {
            Err(Error::MissingBinary {
                component: name.to_owned(),
                version: "workspace".into(),
                path: p,
            })
        }
    };
    let mut vcp = from_binaries(
        VCP_DEV_IMAGE,
        &[("vcp", bin("vcp")?)],
        vec!["/usr/local/bin/vcp".to_owned()],
        vec!["serve".to_owned()],
    )?;
    vcp.also = vec![format!("ghcr.io/vcp-dev/vcp:{release}")];
    let mut syncer = from_binaries(
        SYNCER_DEV_IMAGE,
        &[("vcp-syncer", bin("vcp-syncer")?)],
        vec!["/usr/local/bin/vcp-syncer".to_owned()],
        Vec::new(),
    )?;
    syncer.also = vec![format!("ghcr.io/vcp-dev/vcp-syncer:{release}")];
    let mut gateway = from_binaries(
        GATEWAY_DEV_IMAGE,
        &[("vcp-gateway", bin("vcp-gateway")?)],
        vec!["/usr/local/bin/vcp-gateway".to_owned()],
        Vec::new(),
    )?;
    gateway.also = vec![format!("ghcr.io/vcp-dev/vcp-gateway:{release}")];
    Ok(vec![vcp, syncer, gateway])
}

/// The chart's evaluation Postgres (`postgres:15`, as its values name it), from Debian's
/// `postgresql-15`: its programs, libraries and data files at Debian's paths, the system time
/// zones it was built against, every shared library they load, the user `postgres` (999, as
/// the official image and the chart's `runAsUser`), and as entrypoint the workspace's
/// `vcp-devnode-postgres`, which does what the official `docker-entrypoint.sh` does for the
/// chart (initdb from `POSTGRES_*`, then `postgres`).
pub fn postgres_image(entrypoint: &Path) -> Result<Image> {
    const PG: &str = "/usr/lib/postgresql/15";
    let mut entries = base_entries((
        "root:x:0:0:root:/root:/sbin/nologin\npostgres:x:999:999:postgres:/var/lib/postgresql:/bin/sh\n",
        "root:x:0:\npostgres:x:999:\n",
    ));
    let mut elves = Vec::new();
    // C.UTF-8 (the image's LANG, which initdb checks) is a compiled locale of glibc's.
    for root in [
        PG,
        "/usr/share/postgresql/15",
        "/usr/share/zoneinfo",
        "/usr/lib/locale/C.utf8",
    ] {
        add_tree(&mut entries, Path::new(root), &mut elves)?;
    }
    add_file(
        &mut entries,
        Path::new("/usr/local/bin/docker-entrypoint"),
        0o755,
        stripped(entrypoint)?,
    );
    elves.push(entrypoint.to_owned());
    add_libraries(&mut entries, &elves, Some(Path::new(PG)))?;
    // initdb runs `postgres -V` through popen(3), which needs /bin/sh (the official image
    // has bash): Debian's static busybox.
    let bb = std::fs::read(BUSYBOX_BIN).map_err(Error::io(BUSYBOX_BIN))?;
    add_file(&mut entries, Path::new("/bin/busybox"), 0o755, bb);
    entries.push(Entry::symlink("bin/sh", "busybox"));
    // The socket and data directories' parent, writable by the image's postgres user.
    add_dirs(&mut entries, Path::new("var/run"), 0o755);
    add_dirs(&mut entries, Path::new("var/lib"), 0o755);
    entries.push(Entry::dir("var/run/postgresql", 0o2777));
    entries.push(Entry::dir("var/lib/postgresql", 0o2777));
    Ok(Image {
        reference: "postgres:15".to_owned(),
        also: vec!["docker.io/library/postgres:15".to_owned()],
        entrypoint: vec!["/usr/local/bin/docker-entrypoint".to_owned()],
        cmd: vec!["postgres".to_owned()],
        env: vec![
            format!("PATH={PG}/bin:/usr/local/bin:/usr/bin:/bin"),
            "PGDATA=/var/lib/postgresql/data".to_owned(),
            "LANG=C.UTF-8".to_owned(),
        ],
        entries,
    })
}

/// Adds a directory tree of this machine at the same path: files, links and directories;
/// records the ELF files among them (for their libraries).
fn add_tree(entries: &mut Vec<Entry>, root: &Path, elves: &mut Vec<PathBuf>) -> Result<()> {
    let meta = std::fs::symlink_metadata(root).map_err(Error::io(root))?;
    let rel = root
        .strip_prefix("/")
        .unwrap_or(root)
        .to_string_lossy()
        .into_owned();
    if meta.file_type().is_symlink() {
        let target = std::fs::read_link(root).map_err(Error::io(root))?;
        entries.push(Entry::symlink(&rel, &target.to_string_lossy()));
    } else if meta.is_dir() {
        add_dirs(entries, Path::new(&rel), 0o755);
        let mut children: Vec<PathBuf> = std::fs::read_dir(root)
            .map_err(Error::io(root))?
            .flatten()
            .map(|e| e.path())
            .collect();
        children.sort();
        for c in children {
            add_tree(entries, &c, elves)?;
        }
    } else {
        let data = std::fs::read(root).map_err(Error::io(root))?;
        if data.starts_with(b"\x7fELF") {
            elves.push(root.to_owned());
        }
        let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777;
        add_file(entries, root, mode, data);
    }
    Ok(())
}

/// The versions catalog vcp ships, whose control-plane images the real node gets.
pub const CATALOG: &str = include_str!("../../../templates/versions.yaml");

/// Everything vcp's platform needs on the real node beyond its start images: the catalog's
/// control-plane images ([`CATALOG`]), vcp's own ([`vcp_images`], from the workspace build in
/// `bin_dir`) and the chart's Postgres ([`postgres_image`]). Also the catalog references
/// skipped because their binaries are not built. CoreDNS is left out: the node imports it at
/// start ([`node_images`]).
pub fn platform_images(bin_dir: &Path) -> Result<(Vec<Image>, Vec<String>)> {
    let (mut imgs, skipped) = control_plane_images(CATALOG)?;
    imgs.retain(|i| i.reference != coredns_image());
    imgs.extend(vcp_images(bin_dir, env!("CARGO_PKG_VERSION"))?);
    imgs.push(postgres_image(&bin_dir.join("vcp-devnode-postgres"))?);
    Ok((imgs, skipped))
}

/// The directory of the workspace's binaries (vcp, vcp-syncer, vcp-devnode-postgres): where
/// the devnode's binary is.
pub fn workspace_bin_dir() -> Result<PathBuf> {
    Ok(crate::cluster::devnode_binary()?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default())
}

/// The dev name of vcp's image (`crate::platform::DEV_TOOLS_IMAGE`).
pub const VCP_DEV_IMAGE: &str = "vcp.dev/vcp:dev";
/// The dev name of the syncer's image (`crate::platform::DEV_SYNCER_IMAGE`).
pub const SYNCER_DEV_IMAGE: &str = "vcp.dev/vcp-syncer:dev";
/// The dev name of the gateway's image (the chart runs it by its release name).
pub const GATEWAY_DEV_IMAGE: &str = "vcp.dev/vcp-gateway:dev";

/// `pause-<tag>` in the binary cache, the tag taken from [`PAUSE_IMAGE`].
pub fn pause_binary() -> Result<PathBuf> {
    let tag = PAUSE_IMAGE.rsplit(':').next().unwrap_or_default();
    let path = bins::bin_dir().join(format!("pause-{tag}"));
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::Image(format!(
            "{} is not built: run tests/kube-bin/build.sh",
            path.display()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn entries_of(tar_bytes: &[u8]) -> Vec<(String, Vec<u8>, tar::EntryType)> {
        let mut a = tar::Archive::new(tar_bytes);
        a.entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let path = e.path().unwrap().to_string_lossy().into_owned();
                let kind = e.header().entry_type();
                let mut data = Vec::new();
                e.read_to_end(&mut data).unwrap();
                (path, data, kind)
            })
            .collect()
    }

    #[test]
    fn the_suites_image_names_come_from_its_manifest() {
        let src = r#"
	initRegistry = RegistryList{
		PromoterE2eRegistry:      "registry.k8s.io/e2e-test-images",
		GcRegistry:               "registry.k8s.io",
	}
	configs[AgnhostPrev] = Config{list.PromoterE2eRegistry, "agnhost", "2.55"}
	configs[BusyBox] = Config{list.PromoterE2eRegistry, "busybox", "1.37.0-2"}
	configs[Pause] = Config{list.GcRegistry, "pause", "3.10.2"}
	configs[Odd] = Config{list.NoSuchRegistry, "odd", "1"}
"#;
        assert_eq!(
            e2e_manifest(src),
            [
                (
                    "AgnhostPrev",
                    "registry.k8s.io/e2e-test-images/agnhost:2.55"
                ),
                (
                    "BusyBox",
                    "registry.k8s.io/e2e-test-images/busybox:1.37.0-2"
                ),
                ("Pause", "registry.k8s.io/pause:3.10.2"),
            ]
            .map(|(a, b)| (a.to_owned(), b.to_owned())),
            "an unknown registry names nothing"
        );
        // The manifest of the default minor, as the real node reads it.
        if let Ok(dir) = agnhost_source() {
            let m = e2e_manifest(
                &std::fs::read_to_string(dir.join("../../utils/image/manifest.go")).unwrap(),
            );
            for id in ["BusyBox", "AgnhostPrev", "Nginx", "NginxNew", "Pause"] {
                assert!(m.iter().any(|(i, _)| i == id), "{id} missing from {m:?}");
            }
        } else {
            eprintln!(
                "skipping the default minor's manifest: agnhost's source is not in the module cache"
            );
        }
    }

    #[test]
    fn an_image_goes_by_the_names_every_supported_suite_gives_it() {
        let m = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        let newest = m(&[("Agnhost", "a:2.66.1"), ("AgnhostPrev", "a:2.55")]);
        let oldest = m(&[("Agnhost", "a:2.59"), ("AgnhostPrev", "a:2.55")]);
        let manifests = [newest, oldest];
        assert_eq!(names_of(&manifests, "Agnhost"), ["a:2.66.1", "a:2.59"]);
        assert_eq!(names_of(&manifests, "AgnhostPrev"), ["a:2.55"]);
        assert!(names_of(&manifests, "Nginx").is_empty());
        let mut img = busybox(b"", &[]);
        img.reference = "a:2.66.1".into();
        img.name_also(
            names_of(&manifests, "Agnhost")
                .into_iter()
                .chain(names_of(&manifests, "AgnhostPrev")),
        );
        img.name_also(["a:2.59".to_owned()]);
        assert_eq!(
            img.also,
            ["a:2.59", "a:2.55"],
            "each name once, never its own"
        );
        // The suites built here, as the real node reads them.
        if let Ok(dir) = agnhost_source() {
            let all = supported_manifests(&dir).unwrap();
            let tags = names_of(&all, "Agnhost");
            assert!(
                all.len() >= 2,
                "the default minor's and another's: {tags:?}"
            );
            for m in &all {
                let own = m.iter().find(|(i, _)| i == "Agnhost").map(|(_, r)| r);
                assert!(
                    own.is_some_and(|r| tags.contains(r)),
                    "{own:?} not in {tags:?}"
                );
            }
        } else {
            eprintln!(
                "skipping the built suites' manifests: agnhost's source is not in the module cache"
            );
        }
    }

    #[test]
    fn the_web_server_stand_in_serves_port_80_under_the_suites_names() {
        let img = web_server(
            b"\x7fELF",
            &["sh", "httpd"],
            vec!["n:1".into(), "n:2".into()],
        );
        assert_eq!(
            (img.reference.as_str(), img.also.as_slice()),
            ("n:1", &["n:2".to_owned()][..])
        );
        assert_eq!(img.cmd[..4], ["httpd", "-f", "-p", "80"]);
        assert!(img.entries.iter().any(
            |e| matches!(e, Entry::File { path, .. } if path == "usr/share/nginx/html/index.html")
        ));
        assert!(
            img.entries
                .iter()
                .any(|e| matches!(e, Entry::Symlink { path, .. } if path == "bin/httpd"))
        );
        assert_eq!(web_server(b"", &[], Vec::new()).reference, WEB_SERVER_IMAGE);
    }

    #[test]
    fn an_archive_names_its_image_and_its_digests_match_its_contents() {
        let img = busybox(b"\x7fELF", &["sh", "ls", "busybox", "ls"]);
        let bytes = img.archive().unwrap();
        let files = entries_of(&bytes);
        let get = |name: &str| {
            files
                .iter()
                .find(|(p, _, _)| p == name)
                .unwrap_or_else(|| panic!("{name} missing"))
                .1
                .clone()
        };
        let manifest: serde_json::Value = serde_json::from_slice(&get("manifest.json")).unwrap();
        assert_eq!(manifest[0]["RepoTags"][0], BUSYBOX_IMAGE);
        let config_name = manifest[0]["Config"].as_str().unwrap();
        let config = get(config_name);
        assert_eq!(format!("{}.json", sha256_hex(&config)), config_name);
        let layer_name = manifest[0]["Layers"][0].as_str().unwrap();
        let layer = get(layer_name);
        let config: serde_json::Value = serde_json::from_slice(&config).unwrap();
        assert_eq!(
            config["rootfs"]["diff_ids"][0],
            format!("sha256:{}", sha256_hex(&layer))
        );
        assert_eq!(config["config"]["Cmd"][0], "sh");
        assert!(config["config"]["Entrypoint"].is_null());

        let layer = entries_of(&layer);
        let names: Vec<&str> = layer.iter().map(|(p, _, _)| p.as_str()).collect();
        assert!(names.contains(&"bin/busybox") && names.contains(&"etc/passwd"));
        // One link per applet, none for busybox itself, no duplicates.
        let links: Vec<&str> = layer
            .iter()
            .filter(|(_, _, k)| *k == tar::EntryType::Symlink)
            .map(|(p, _, _)| p.as_str())
            .collect();
        assert_eq!(links, ["bin/ls", "bin/sh"]);
    }

    #[test]
    fn ldd_output_gives_the_libraries_and_the_loader() {
        let out = "\tlinux-vdso.so.1 (0x00007f80f2c51000)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f80f2a5e000)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f80f2c53000)\n";
        assert_eq!(
            ldd_libraries(out),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2")
            ]
        );
        assert!(ldd_libraries("\tnot a dynamic executable\n").is_empty());
        assert!(ldd_libraries("\tstatically linked\n").is_empty());
    }

    #[test]
    fn files_come_with_their_directories_once() {
        let mut e = Vec::new();
        add_file(&mut e, Path::new("/usr/local/bin/a"), 0o755, vec![1]);
        add_file(&mut e, Path::new("/usr/local/bin/b"), 0o755, vec![2]);
        let dirs: Vec<&str> = e
            .iter()
            .filter_map(|e| match e {
                Entry::Dir { path, .. } => Some(path.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(dirs, ["usr", "usr/local", "usr/local/bin"]);
    }

    #[test]
    fn dev_image_names_are_the_platforms() {
        assert_eq!(VCP_DEV_IMAGE, crate::platform::DEV_TOOLS_IMAGE);
        assert_eq!(SYNCER_DEV_IMAGE, crate::platform::DEV_SYNCER_IMAGE);
    }

    #[test]
    fn the_dns_prober_has_dig_getent_and_a_hosts_then_dns_switch() {
        let dig = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(dig.path(), b"dig").unwrap();
        let img = dns_prober(
            "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1",
            b"bb",
            &["sh", "seq"],
            &[("dig", dig.path().to_owned())],
        )
        .unwrap();
        let has = |p: &str| {
            img.entries
                .iter()
                .any(|e| matches!(e, Entry::File { path, .. } if path == p))
        };
        assert!(has("usr/bin/dig") && has("bin/busybox") && has("etc/nsswitch.conf"));
        assert!(img.entries.contains(&Entry::symlink("bin/seq", "busybox")));
        assert_eq!(img.cmd, ["/bin/sh"]);
    }

    #[test]
    fn the_shell_replaces_busyboxs_and_the_applets_stay() {
        let sh = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(sh.path(), b"a shell").unwrap();
        let mut img = busybox(b"bb", &["sh", "nc", "cat"]);
        with_shell(&mut img, sh.path()).unwrap();
        let shells: Vec<&Entry> = img
            .entries
            .iter()
            .filter(|e| {
                matches!(e, Entry::Symlink { path, .. } | Entry::File { path, .. } if path == "bin/sh")
            })
            .collect();
        assert_eq!(shells, [&Entry::symlink("bin/sh", "/usr/bin/sh")]);
        assert!(
            img.entries
                .contains(&Entry::file("usr/bin/sh", 0o755, b"a shell".to_vec()))
        );
        for applet in ["bin/nc", "bin/cat"] {
            assert!(img.entries.contains(&Entry::symlink(applet, "busybox")));
        }
    }

    /// Debian's bash, run as `sh`, keeps what Debian's busybox shell loses (the reasons for
    /// [`SHELL`]).
    #[test]
    fn the_shell_keeps_odd_environment_names_and_looks_commands_up_on_path() {
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        let nc = dir.path().join("nc");
        std::fs::write(&nc, "#!/bin/sh\necho not-busybox\n").unwrap();
        std::fs::set_permissions(&nc, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = std::process::Command::new(SHELL)
            .arg0("sh")
            .args(["-c", "env; nc"])
            .env_clear()
            .env("PATH", format!("{}:/bin", dir.path().display()))
            .env("data-1", "value-1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("data-1=value-1"), "{text}");
        assert!(text.contains("not-busybox"), "{text}");
    }

    #[test]
    fn the_update_demo_is_agnhost_serving_its_files_from_the_root() {
        let bin = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(bin.path(), b"not an ELF").unwrap();
        let base = agnhost("2.66.1", bin.path(), b"bb", &["sh"], (vec![], vec![]), &[]).unwrap();
        let demo = update_demo(
            &base,
            "registry.k8s.io/e2e-test-images/nautilus:1.8",
            vec![(
                "data.json".into(),
                b"{\"image\": \"nautilus.jpg\"}".to_vec(),
            )],
        );
        assert_eq!(
            demo.reference,
            "registry.k8s.io/e2e-test-images/nautilus:1.8"
        );
        assert_eq!(
            (demo.entrypoint.as_slice(), demo.cmd.as_slice()),
            (
                &["/agnhost".to_owned()][..],
                &["test-webserver".to_owned()][..]
            )
        );
        assert!(demo.entries.contains(&Entry::file(
            "data.json",
            0o644,
            b"{\"image\": \"nautilus.jpg\"}".to_vec()
        )));
        assert!(demo.also.is_empty(), "agnhost's other names stay agnhost's");
    }

    #[test]
    fn agnhost_is_laid_out_as_the_conformance_suite_runs_it() {
        let bin = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(bin.path(), b"not an ELF: no libraries").unwrap();
        let nc = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(nc.path(), b"openbsd nc").unwrap();
        let img = agnhost(
            "2.66.1",
            bin.path(),
            b"bb",
            &["sh", "nc", "cat"],
            (b"crt".to_vec(), b"key".to_vec()),
            &[("nc", nc.path().to_owned())],
        )
        .unwrap();
        assert_eq!(
            img.reference,
            "registry.k8s.io/e2e-test-images/agnhost:2.66.1"
        );
        assert_eq!(
            (img.entrypoint.as_slice(), img.cmd.as_slice()),
            (&["/agnhost".to_owned()][..], &["pause".to_owned()][..])
        );
        let file = |p: &str| {
            img.entries.iter().find_map(|e| match e {
                Entry::File { path, data, .. } if path == p => {
                    Some(String::from_utf8_lossy(data).into_owned())
                }
                _ => None,
            })
        };
        assert_eq!(file("agnhost").as_deref(), Some("not an ELF: no libraries"));
        assert_eq!(
            file("etc/nsswitch.conf").as_deref(),
            Some("hosts: files dns\n"),
            "getent reads the hosts file first, as musl does"
        );
        assert!(
            img.entries
                .contains(&Entry::symlink("agnhost-2", "agnhost"))
        );
        assert!(img.entries.contains(&Entry::symlink("bin/nc", "busybox")));
        // A Debian tool in /usr/bin, ahead of busybox's applet of the same name on PATH.
        assert_eq!(file("usr/bin/nc").as_deref(), Some("openbsd nc"));
        let path = img.env[0].trim_start_matches("PATH=");
        let dirs: Vec<&str> = path.split(':').collect();
        let at = |d: &str| dirs.iter().position(|x| *x == d).unwrap();
        assert!(at("/usr/bin") < at("/bin"), "{path}");
        // The users and groups the suite's security-context tests expect of the image, once.
        let passwd = file("etc/passwd").unwrap();
        assert!(passwd.contains("user-defined-in-image:x:1000:"), "{passwd}");
        assert!(
            file("etc/group")
                .unwrap()
                .contains("group-defined-in-image:x:50000:")
        );
        let etc_files = img
            .entries
            .iter()
            .filter(|e| matches!(e, Entry::File { path, .. } if path == "etc/passwd"))
            .count();
        assert_eq!(etc_files, 1);
        assert!(img.entries.contains(&Entry::dir("uploads", 0o777)));
    }

    #[test]
    fn the_same_image_gives_the_same_bytes() {
        let a = pause(b"binary").archive().unwrap();
        let b = pause(b"binary").archive().unwrap();
        assert_eq!(a, b);
        assert_ne!(a, pause(b"other").archive().unwrap());
    }
}
