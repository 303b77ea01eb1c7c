//! The web console in a real browser: Debian's headless Chromium, driven through its
//! chromedriver (W3C WebDriver, with fantoccini) on loopback, against a real `vcp serve`.
//! Used by `tests/fleet.rs`, whose fleet upgrade gives the console real tenants and a fleet
//! upgrade in progress to show (docs/console.md, "Tests").
//!
//! Network: chromedriver listens on 127.0.0.1 only, and Chromium is started with every
//! background service off (updates, sync, safe browsing lists, QUIC) and no proxy, so the only
//! connections it makes are to vcp on loopback; without those flags it tries to reach Google,
//! which this machine's network refuses.

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;
use vcp_dev::process::{ProcSpec, Spawned, Supervision};
use vcp_dev::testing::eventually;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// How long the page may take to show what the API answered (it asks at once, and polls
/// fleet upgrades every 2 s).
pub const SHOWN_WITHIN: Duration = Duration::from_secs(30);

/// Where screenshots go: `target/test-artifacts/console/` (kept after the run, for people).
pub fn artifacts_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("test-artifacts/console")
}

/// A headless Chromium session. Dropping it stops chromedriver's process group, Chromium
/// with it; [`Browser::close`] ends the session first, as a person closing the window would.
pub struct Browser {
    pub client: Client,
    artifacts: PathBuf,
    shots: std::sync::atomic::AtomicUsize,
    // Fields drop in order: the driver (and its browser) before the profile they write to.
    _driver: Spawned,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver on a free loopback port and a Chromium session with a fresh
    /// profile. Fails, saying what to install, when either program is missing: the console is
    /// tested in a real browser or the test fails (CI installs both through tests/setup.sh).
    pub async fn start() -> anyhow::Result<Browser> {
        for (bin, package) in [(CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")] {
            anyhow::ensure!(
                Path::new(bin).exists(),
                "{bin} is missing: the console test drives Debian's headless Chromium; install \
                 it with `apt-get install -y --no-install-recommends chromium chromium-driver` \
                 (tests/setup.sh does), package {package}"
            );
        }
        let artifacts = artifacts_dir();
        std::fs::create_dir_all(&artifacts)?;
        // Screenshots of an earlier run would pass for this run's.
        for f in std::fs::read_dir(&artifacts)? {
            let f = f?.path();
            if f.extension().is_some_and(|e| e == "png") {
                std::fs::remove_file(f)?;
            }
        }
        let profile = tempfile::tempdir()?;
        let [port] = vcp_dev::process::free_ports()?;
        let driver = vcp_dev::process::spawn(
            &ProcSpec::new("chromedriver", CHROMEDRIVER).arg(format!("--port={port}")),
            Supervision::Attached,
            &profile.path().join("chromedriver.log"),
        )?;
        let url = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        eventually("chromedriver ready", Duration::from_secs(30), || async {
            let ready = match http.get(format!("{url}/status")).send().await {
                Ok(r) => r.json::<Value>().await.ok(),
                Err(_) => None,
            };
            Ok(ready.filter(|s| s["value"]["ready"] == true).map(|_| ()))
        })
        .await?;
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-proxy-server",
            "--window-size=1400,1000",
        ]
        .map(String::from)
        .into_iter()
        .chain([format!("--user-data-dir={}", profile.path().display())])
        .collect::<Vec<_>>();
        let caps = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
        });
        let caps: fantoccini::wd::Capabilities = serde_json::from_value(caps)?;
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&url)
            .await?;
        Ok(Browser {
            client,
            artifacts,
            shots: Default::default(),
            _driver: driver,
            _profile: profile,
        })
    }

    /// Saves a screenshot of the window as `NN-name.png` among the artifacts.
    pub async fn screenshot(&self, name: &str) -> anyhow::Result<PathBuf> {
        let n = 1 + self
            .shots
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let png = self.client.screenshot().await?;
        anyhow::ensure!(png.starts_with(b"\x89PNG"), "the screenshot is not a PNG");
        let path = self.artifacts.join(format!("{n:02}-{name}.png"));
        std::fs::write(&path, png)?;
        eprintln!("screenshot {}", path.display());
        Ok(path)
    }

    /// The text of the first element `css` matches, once there is one on the page and shown.
    /// Read by one script, so a view redrawing itself (the upgrade view, every 2 s) cannot
    /// swap the element between finding and reading it.
    pub async fn text_of(&self, css: &str) -> anyhow::Result<String> {
        eventually(
            &format!("{css} shown on the page"),
            SHOWN_WITHIN,
            || async {
                let v = self
                    .client
                    .execute(
                        "const e = document.querySelector(arguments[0]);
                     return e && e.getClientRects().length > 0 ? e.textContent : null;",
                        vec![json!(css)],
                    )
                    .await?;
                Ok(v.as_str().map(str::to_owned))
            },
        )
        .await
    }

    /// Attribute `attr` of every element `css` matches, now.
    pub async fn attrs(&self, css: &str, attr: &str) -> anyhow::Result<Vec<String>> {
        let v = self
            .client
            .execute(
                "return Array.from(document.querySelectorAll(arguments[0]),
                   (e) => e.getAttribute(arguments[1]) || '');",
                vec![json!(css), json!(attr)],
            )
            .await?;
        Ok(serde_json::from_value(v)?)
    }

    /// Waits until `css` is shown and clicks it, as a person would (a WebDriver click).
    pub async fn click(&self, css: &str) -> anyhow::Result<()> {
        self.text_of(css).await?;
        self.client.find(Locator::Css(css)).await?.click().await?;
        Ok(())
    }

    /// Opens a view of the page (`#/...`) as a link in it would.
    pub async fn view(&self, hash: &str) -> anyhow::Result<()> {
        self.client
            .execute("window.location.hash = arguments[0];", vec![json!(hash)])
            .await?;
        Ok(())
    }

    /// Scrolls the page to the first element `css` matches (screenshots show the window only).
    pub async fn scroll_to(&self, css: &str) -> anyhow::Result<()> {
        self.text_of(css).await?;
        self.client
            .execute(
                "document.querySelector(arguments[0]).scrollIntoView();",
                vec![json!(css)],
            )
            .await?;
        Ok(())
    }

    /// Every request the page made, with its answer, as the page recorded them
    /// (`window.vcpRequests`: url, method, status, body).
    pub async fn requests(&self) -> anyhow::Result<Vec<Value>> {
        let v = self
            .client
            .execute("return window.vcpRequests || [];", vec![])
            .await?;
        Ok(v.as_array().cloned().unwrap_or_default())
    }

    /// Logs in on the page's form with `token` (the page must show the form).
    pub async fn log_in(&self, token: &str) -> anyhow::Result<()> {
        self.text_of("#login").await?;
        let input = self.client.find(Locator::Css("#token")).await?;
        input.send_keys(token).await?;
        self.client
            .find(Locator::Css("#login-submit"))
            .await?
            .click()
            .await?;
        Ok(())
    }

    /// Ends the session (Chromium exits); chromedriver stops when the browser is dropped.
    pub async fn close(self) -> anyhow::Result<()> {
        self.client.clone().close().await?;
        Ok(())
    }
}
