//! The guest's initramfs: Debian's static busybox, the kernel's own 9p/virtio modules and
//! `xtask/scripts/vm-init.sh` as `/init`, in the `newc` cpio format the kernel unpacks.
//!
//! Why our own and not virtme-ng: the guest needs only a shell that loads a handful of modules,
//! mounts the host's root read-only over 9p with writable tmpfs where the tests write, and
//! powers off — about forty lines of init. virtme-ng would add a PyPI dependency and its own
//! init and mount layout, and it expects the kernel's modules installed under the shared
//! root's `/lib/modules`, which would mean installing three foreign kernels on the host. The
//! modules come from the kernel package itself (Debian builds 9p and virtio as modules), so
//! each kernel boots with exactly its own.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

use crate::sh;

/// Debian's `busybox-static` binary.
pub const BUSYBOX: &str = "/bin/busybox";

/// PID 1 of the guest.
const INIT: &str = include_str!("../../scripts/vm-init.sh");

/// The initramfs for the kernel whose decompressed modules and `order` file are in `modules`.
pub fn build(modules: &Path) -> Result<Vec<u8>> {
    let busybox = std::fs::read(BUSYBOX).with_context(|| {
        format!(
            "{BUSYBOX} (Debian's busybox-static; `cargo xtask setup --interpreters` installs it)"
        )
    })?;
    let mut cpio = Cpio::default();
    for dir in ["bin", "dev", "proc", "sys", "newroot", "modules", "tmp"] {
        cpio.dir(dir);
    }
    cpio.char_device("dev/console", 5, 1);
    cpio.file("bin/busybox", 0o755, &busybox);
    cpio.file("init", 0o755, INIT.as_bytes());
    let order = std::fs::read_to_string(modules.join("order"))
        .with_context(|| format!("{}/order", modules.display()))?;
    cpio.file("modules/order", 0o644, order.as_bytes());
    for name in order.lines().filter(|l| !l.is_empty()) {
        cpio.file(
            &format!("modules/{name}"),
            0o644,
            &std::fs::read(modules.join(name))?,
        );
    }
    Ok(cpio.finish())
}

/// The modules to load for `roots`, dependencies first, as (name, path in `tree`); built-in
/// ones (listed in `modules.builtin`) are left out.
pub fn module_closure(tree: &Path, roots: &[&str]) -> Result<Vec<(String, PathBuf)>> {
    let builtin: Vec<String> = std::fs::read_to_string(tree.join("modules.builtin"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.rsplit('/').next())
        .map(module_name)
        .collect();
    let mut index = BTreeMap::new();
    index_modules(&tree.join("kernel"), &mut index)?;
    let mut order = Vec::new();
    for root in roots {
        visit(root, &index, &builtin, &mut order, 0)?;
    }
    Ok(order)
}

fn visit(
    name: &str,
    index: &BTreeMap<String, PathBuf>,
    builtin: &[String],
    order: &mut Vec<(String, PathBuf)>,
    depth: usize,
) -> Result<()> {
    let name = module_name(name);
    if depth > 32 {
        bail!("module dependencies of {name} nest too deep");
    }
    if builtin.contains(&name) || order.iter().any(|(n, _)| *n == name) {
        return Ok(());
    }
    let path = index
        .get(&name)
        .with_context(|| format!("module {name} is neither built in nor in the package"))?;
    for dep in depends(&read_module(path)?)? {
        visit(&dep, index, builtin, order, depth + 1)?;
    }
    order.push((name, path.clone()));
    Ok(())
}

/// `9pnet-virtio.ko.xz` → `9pnet_virtio` (the kernel treats `-` and `_` alike).
fn module_name(file: &str) -> String {
    let stem = file.split(".ko").next().unwrap_or(file);
    stem.replace('-', "_")
}

fn index_modules(dir: &Path, index: &mut BTreeMap<String, PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
        let path = entry?.path();
        if path.is_dir() {
            index_modules(&path, index)?;
        } else if let Some(file) = path.file_name().and_then(|f| f.to_str())
            && file.contains(".ko")
        {
            index.insert(module_name(file), path.clone());
        }
    }
    Ok(())
}

/// A module's ELF bytes (`.ko`, or `.ko.xz`/`.ko.zst` decompressed with xz/zstd).
pub fn read_module(path: &Path) -> Result<Vec<u8>> {
    let name = path.to_string_lossy();
    let tool = if name.ends_with(".xz") {
        "xz"
    } else if name.ends_with(".zst") {
        "zstd"
    } else {
        return Ok(std::fs::read(path)?);
    };
    let out = sh::clean(tool)
        .arg("-dc")
        .arg(path)
        .output()
        .with_context(|| format!("running {tool} on {name}"))?;
    if !out.status.success() {
        bail!("{tool} -dc {name} failed");
    }
    Ok(out.stdout)
}

/// The `depends=` list of a module's `.modinfo` section.
fn depends(elf: &[u8]) -> Result<Vec<String>> {
    use object::{Object as _, ObjectSection as _};
    let obj = object::File::parse(elf).context("a module that is not ELF")?;
    let bytes = obj
        .section_by_name(".modinfo")
        .context("a module without .modinfo")?
        .data()
        .context(".modinfo outside the file")?;
    Ok(bytes
        .split(|&b| b == 0)
        .filter_map(|kv| kv.strip_prefix(b"depends="))
        .flat_map(|list| list.split(|&b| b == b','))
        .filter(|d| !d.is_empty())
        .map(|d| String::from_utf8_lossy(d).into_owned())
        .collect())
}

/// A `newc` ("070701") cpio archive, as `gen_init_cpio` writes it.
#[derive(Default)]
struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        self.ino += 1;
        let name_len = name.len() + 1;
        let fields = [
            self.ino,
            mode,
            0, // uid
            0, // gid
            1, // nlink
            0, // mtime
            u32::try_from(data.len()).expect("initramfs member under 4 GiB"),
            0, // dev major
            0, // dev minor
            rdev.0,
            rdev.1,
            u32::try_from(name_len).expect("short name"),
            0, // check
        ];
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040_755, (0, 0), &[]);
    }

    fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, 0o100_000 | perm, (0, 0), data);
    }

    fn char_device(&mut self, name: &str, major: u32, minor: u32) {
        self.entry(name, 0o020_600, (major, minor), &[]);
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpio_members_are_aligned_and_readable() {
        let mut c = Cpio::default();
        c.dir("bin");
        c.file("bin/x", 0o755, b"hello");
        c.char_device("dev/console", 5, 1);
        let out = c.finish();
        assert!(out.len().is_multiple_of(4));
        // Walk the archive back: names, sizes and the trailer.
        let mut at = 0;
        let mut names = Vec::new();
        while at < out.len() {
            assert_eq!(&out[at..at + 6], b"070701");
            let field = |i: usize| {
                let s = std::str::from_utf8(&out[at + 6 + i * 8..at + 14 + i * 8]).unwrap();
                usize::from_str_radix(s, 16).unwrap()
            };
            let (size, name_len) = (field(6), field(11));
            let name_at = at + 110;
            names.push(String::from_utf8(out[name_at..name_at + name_len - 1].to_vec()).unwrap());
            let data_at = (name_at + name_len).next_multiple_of(4);
            if names.last().unwrap() == "bin/x" {
                assert_eq!(&out[data_at..data_at + size], b"hello");
                assert_eq!(field(1), 0o100_755);
            }
            if names.last().unwrap() == "dev/console" {
                assert_eq!((field(9), field(10)), (5, 1));
            }
            at = (data_at + size).next_multiple_of(4);
        }
        assert_eq!(names, ["bin", "bin/x", "dev/console", "TRAILER!!!"]);
    }

    #[test]
    fn module_names_normalise() {
        assert_eq!(module_name("9pnet_virtio.ko"), "9pnet_virtio");
        assert_eq!(module_name("virtio-pci.ko.xz"), "virtio_pci");
        assert_eq!(module_name("9p"), "9p");
    }

    #[test]
    fn depends_come_from_modinfo() {
        // A module's .modinfo is NUL-separated `key=value` strings; gcc builds one like it.
        let dir = std::env::temp_dir().join(format!("xtask-modinfo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("m.c"),
            "__attribute__((section(\".modinfo\"), used)) static const char info[] =\n\
             \"license=GPL\\0depends=9pnet,virtio_ring\\0vermagic=5.10\";\n",
        )
        .unwrap();
        let ok = std::process::Command::new("gcc")
            .arg("-c")
            .arg(dir.join("m.c"))
            .arg("-o")
            .arg(dir.join("m.ko"))
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "gcc (build-essential, installed by setup) could not build the fixture"
        );
        let elf = std::fs::read(dir.join("m.ko")).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(depends(&elf).unwrap(), ["9pnet", "virtio_ring"]);
        assert!(depends(b"not an elf").is_err());
    }
}
