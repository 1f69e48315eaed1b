//! Debian's kernel packages for the matrix: the newest `linux-image-<series>…-amd64-unsigned`
//! a private apt state can download (bullseye for 5.10, bookworm and bookworm-security for 6.1
//! and 6.12), unpacked once into the test cache. Kept from each package: `vmlinuz`, its
//! `config`, and the modules the guest needs to mount the host's root (9p over virtio-pci, with
//! their dependencies, decompressed), in load order.
//!
//! The system's apt configuration is never touched: lists and downloads live under
//! `$CACHE/work/kernel-apt` (the same method as `xtask/scripts/build-pythons.sh`). A kernel
//! whose `kernel.json` exists is not fetched again; `rm -rf $CACHE/kernels/<series>` refreshes
//! it.
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use serde::{Deserialize, Serialize};

use crate::interpreters::Cache;
use crate::sh::{self, say};

/// A kernel series of the matrix and where Debian ships it.
pub struct Series {
    /// `5.10`, `6.1`, `6.12`.
    pub name: &'static str,
    /// The Debian release that ships it (for messages).
    pub debian: &'static str,
}

/// The matrix, oldest first.
pub const SERIES: [Series; 3] = [
    Series {
        name: "5.10",
        debian: "Debian 11 (bullseye)",
    },
    Series {
        name: "6.1",
        debian: "Debian 12 (bookworm)",
    },
    Series {
        name: "6.12",
        debian: "Debian 12 (bookworm-security) / Debian 13",
    },
];

/// The modules the guest loads to mount the host's root over 9p; their dependencies are added
/// from each module's `.modinfo`. Built-in ones (`modules.builtin`) are skipped.
const ROOT_MODULES: [&str; 3] = ["virtio_pci", "9pnet_virtio", "9p"];

/// A kernel unpacked in the cache (`kernel.json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Kernel {
    /// Series name (`5.10`).
    pub series: String,
    /// Debian package and version.
    pub package: String,
    pub version: String,
    /// `uname -r` of the kernel.
    pub release: String,
    /// Its directory in the cache.
    pub dir: PathBuf,
}

impl Kernel {
    pub fn vmlinuz(&self) -> PathBuf {
        self.dir.join("vmlinuz")
    }

    /// Decompressed modules, loaded in the order of `modules/order`.
    pub fn modules(&self) -> PathBuf {
        self.dir.join("modules")
    }
}

/// The kernel of `series` from the cache, fetching and unpacking it first if needed.
pub fn ensure(cache: &Cache, series: &Series) -> Result<Kernel> {
    let dir = cache.0.join("kernels").join(series.name);
    let manifest = dir.join("kernel.json");
    if let Ok(text) = std::fs::read_to_string(&manifest)
        && let Ok(kernel) = serde_json::from_str::<Kernel>(&text)
        && kernel.vmlinuz().is_file()
    {
        say(
            "kernels",
            format!(
                "{}: {} {} cached - skip",
                series.name, kernel.package, kernel.version
            ),
        );
        return Ok(kernel);
    }
    let apt = PrivateApt::new(cache)?;
    let candidates = apt.candidates(series.name)?;
    if candidates.is_empty() {
        bail!(
            "no linux-image-{}*-amd64-unsigned package in {} (private apt state {})",
            series.name,
            series.debian,
            apt.dir.display()
        );
    }
    let downloads = cache.0.join("work/kernel-downloads");
    std::fs::create_dir_all(&downloads)?;
    let mut last_err = None;
    for package in candidates.iter().rev() {
        match apt.download(package, &downloads) {
            Ok(deb) => {
                let kernel = unpack(series, package, &deb, &dir)?;
                let _ = std::fs::remove_file(&deb);
                std::fs::write(&manifest, serde_json::to_string_pretty(&kernel)?)?;
                say(
                    "kernels",
                    format!(
                        "{}: {} {} (uname -r {}) -> {}",
                        series.name,
                        kernel.package,
                        kernel.version,
                        kernel.release,
                        dir.display()
                    ),
                );
                return Ok(kernel);
            }
            Err(e) => {
                say("kernels", format!("{package}: download failed: {e:#}"));
                last_err = Some(e);
            }
        }
    }
    Err(last_err.unwrap_or_else(|| anyhow::anyhow!("no package downloaded")))
}

/// apt with its own sources, lists and cache under `$CACHE/work/kernel-apt`.
struct PrivateApt {
    dir: PathBuf,
}

impl PrivateApt {
    fn new(cache: &Cache) -> Result<PrivateApt> {
        let dir = cache.0.join("work/kernel-apt");
        for sub in [
            "etc/sources.list.d",
            "etc/preferences.d",
            "lists/partial",
            "cache/archives/partial",
        ] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let (main, security) = mirrors();
        let keyring = "/usr/share/keyrings/debian-archive-keyring.gpg";
        let mut sources = String::new();
        for (uri, suite) in [
            (&main, "bullseye"),
            (&security, "bullseye-security"),
            (&main, "bookworm"),
            (&main, "bookworm-updates"),
            (&security, "bookworm-security"),
        ] {
            let _ = writeln!(sources, "deb [signed-by={keyring}] {uri} {suite} main");
        }
        let list = dir.join("etc/sources.list");
        let changed = std::fs::read_to_string(&list).ok().as_deref() != Some(&sources);
        std::fs::write(&list, &sources)?;
        let apt = PrivateApt { dir };
        let have_lists = std::fs::read_dir(apt.dir.join("lists"))?
            .flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with("_Packages"));
        if changed || !have_lists {
            say(
                "kernels",
                format!("apt-get update (private state {})", apt.dir.display()),
            );
            let out = apt.cmd("apt-get").arg("update").output()?;
            if !out.status.success() {
                bail!(
                    "private apt-get update failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
        }
        Ok(apt)
    }

    fn cmd(&self, program: &str) -> std::process::Command {
        let d = |sub: &str| self.dir.join(sub).display().to_string();
        let mut cmd = sh::clean(program);
        for (k, v) in [
            ("Dir::Etc::SourceList", d("etc/sources.list")),
            ("Dir::Etc::SourceParts", d("etc/sources.list.d")),
            ("Dir::Etc::Preferences", d("etc/preferences")),
            ("Dir::Etc::PreferencesParts", d("etc/preferences.d")),
            ("Dir::State::Lists", d("lists")),
            ("Dir::State::status", "/dev/null".to_string()),
            ("Dir::Cache", d("cache")),
            ("Dir::Cache::pkgcache", String::new()),
            ("Dir::Cache::srcpkgcache", String::new()),
            ("APT::Sandbox::User", "root".to_string()),
        ] {
            cmd.arg("-o").arg(format!("{k}={v}"));
        }
        cmd
    }

    /// Package names of `series`' generic amd64 kernel image, oldest ABI first.
    fn candidates(&self, series: &str) -> Result<Vec<String>> {
        let prefix = format!("linux-image-{series}");
        let out = sh::capture(self.cmd("apt-cache").args(["pkgnames", &prefix]))?;
        let mut names: Vec<String> = out
            .lines()
            .filter(|n| is_series_image(n, series))
            .map(str::to_owned)
            .collect();
        names.sort_by_key(|n| natural_key(n));
        Ok(names)
    }

    /// `apt-get download package` into `dir`; the `.deb` path.
    fn download(&self, package: &str, dir: &Path) -> Result<PathBuf> {
        let mut cmd = self.cmd("apt-get");
        cmd.args(["download", package]).current_dir(dir);
        let out = cmd.output()?;
        if !out.status.success() {
            bail!("{}", String::from_utf8_lossy(&out.stderr).trim());
        }
        std::fs::read_dir(dir)?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(&format!("{package}_")))
            })
            .context("apt-get download left no .deb")
    }
}

/// `linux-image-<series>.…-amd64-unsigned` or `linux-image-<series>-…`, not cloud or rt.
fn is_series_image(name: &str, series: &str) -> bool {
    let Some(rest) = name.strip_prefix(&format!("linux-image-{series}")) else {
        return false;
    };
    (rest.starts_with('.') || rest.starts_with('-'))
        && rest.ends_with("-amd64-unsigned")
        && !rest.contains("-cloud-")
        && !rest.contains("-rt-")
}

/// Sort key comparing runs of digits as numbers (`5.10.0-46` after `5.10.0-9`).
fn natural_key(s: &str) -> Vec<(u64, String)> {
    let mut key = Vec::new();
    let mut chars = s.chars().peekable();
    while chars.peek().is_some() {
        let digits: String = std::iter::from_fn(|| chars.next_if(char::is_ascii_digit)).collect();
        let text: String = std::iter::from_fn(|| chars.next_if(|c| !c.is_ascii_digit())).collect();
        key.push((digits.parse().unwrap_or(0), text));
    }
    key
}

/// The main and security mirrors of this machine's deb822 sources (Debian's defaults if
/// none are found); `MIRROR` overrides the main one, as for `build-pythons.sh`.
fn mirrors() -> (String, String) {
    let mut main = std::env::var("MIRROR").ok();
    let mut security = None;
    let mut uri = None;
    for entry in std::fs::read_dir("/etc/apt/sources.list.d")
        .into_iter()
        .flatten()
        .flatten()
    {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        for line in text.lines() {
            if let Some(u) = line.strip_prefix("URIs:") {
                uri = u.split_whitespace().next().map(str::to_owned);
            } else if let Some(suites) = line.strip_prefix("Suites:") {
                if suites.contains("-security") {
                    security = security.or_else(|| uri.clone());
                } else {
                    main = main.or_else(|| uri.clone());
                }
            }
        }
    }
    let main = main.unwrap_or_else(|| "http://deb.debian.org/debian".into());
    let security = security.unwrap_or_else(|| format!("{main}-security"));
    (main, security)
}

/// Unpack `deb` into a scratch directory and keep what the matrix needs in `dir`.
fn unpack(series: &Series, package: &str, deb: &Path, dir: &Path) -> Result<Kernel> {
    let scratch = dir.with_extension("unpack");
    let _ = std::fs::remove_dir_all(&scratch);
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(&scratch)?;
    sh::run(sh::clean("dpkg-deb").arg("-x").arg(deb).arg(&scratch))?;
    let version = sh::capture(sh::clean("dpkg-deb").args(["-f"]).arg(deb).arg("Version"))?
        .trim()
        .to_owned();
    let modules_root = scratch.join("lib/modules");
    let release = std::fs::read_dir(&modules_root)
        .with_context(|| format!("{}: no lib/modules", deb.display()))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
        .context("no kernel release under lib/modules")?;
    let tree = modules_root.join(&release);
    std::fs::create_dir_all(dir.join("modules"))?;
    std::fs::copy(
        scratch.join(format!("boot/vmlinuz-{release}")),
        dir.join("vmlinuz"),
    )?;
    std::fs::copy(
        scratch.join(format!("boot/config-{release}")),
        dir.join("config"),
    )?;
    let order = super::initramfs::module_closure(&tree, &ROOT_MODULES)?;
    let mut list = String::new();
    for (name, path) in &order {
        let file = format!("{name}.ko");
        std::fs::write(
            dir.join("modules").join(&file),
            super::initramfs::read_module(path)?,
        )?;
        list.push_str(&file);
        list.push('\n');
    }
    std::fs::write(dir.join("modules/order"), list)?;
    std::fs::remove_dir_all(&scratch)?;
    Ok(Kernel {
        series: series.name.to_owned(),
        package: package.to_owned(),
        version,
        release,
        dir: dir.to_path_buf(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_generic_images_of_the_series_only() {
        for (name, series, want) in [
            ("linux-image-5.10.0-46-amd64-unsigned", "5.10", true),
            ("linux-image-5.10.0-46-cloud-amd64-unsigned", "5.10", false),
            ("linux-image-5.10.0-46-rt-amd64-unsigned", "5.10", false),
            ("linux-image-5.10.0-46-amd64", "5.10", false),
            ("linux-image-5.10.0-46-amd64-dbg", "5.10", false),
            ("linux-image-6.1.0-57-amd64-unsigned", "6.1", true),
            ("linux-image-6.12.107+deb12-amd64-unsigned", "6.1", false),
            ("linux-image-6.12.107+deb12-amd64-unsigned", "6.12", true),
        ] {
            assert_eq!(is_series_image(name, series), want, "{name} in {series}");
        }
    }

    #[test]
    fn natural_order_compares_numbers() {
        let mut v = [
            "linux-image-5.10.0-46-amd64-unsigned",
            "linux-image-5.10.0-9-amd64-unsigned",
            "linux-image-5.10.0-45-amd64-unsigned",
        ];
        v.sort_by_key(|n| natural_key(n));
        assert_eq!(v.last(), Some(&"linux-image-5.10.0-46-amd64-unsigned"));
        assert_eq!(v[0], "linux-image-5.10.0-9-amd64-unsigned");
    }
}
