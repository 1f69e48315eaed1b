//! [`CoreMemory`]: the reader's memory trait over a core file and the files it maps.
//!
//! Owns: address → bytes for a core: a page comes from the core when a `PT_LOAD` segment holds
//! it, else from the file `NT_FILE` says is mapped there (read-only file-backed mappings —
//! code, read-only data, the `.PyRuntime` section's file image — are usually left out of cores),
//! opened under the root directory given (`--root`: `/`, or a container's root); else the read
//! fails. Also the list of mapped files that could not be found there.
//! Input: a [`CoreFile`], a root directory. Output: [`ReadMemory`] reads.
//! Constraints: a core never changes, so pages are cached for the whole dump (at most
//! [`MAX_CACHED_PAGES`]); files are opened once; a path from the core with a `..` component is
//! never opened (it could leave the root); the bytes of a mapped file past its end read as
//! zeros, as the kernel maps them.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::fs::File;
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;

use super::CoreFile;
use crate::lru::Lru;
use crate::python::memory::{MAX_READ, MemError, PAGE, ReadMemory};

/// Pages kept (64 MiB).
pub const MAX_CACHED_PAGES: usize = 16 * 1024;
/// Most mapped files kept open.
const MAX_OPEN_FILES: usize = 4096;

/// Where the core's mapped files live, and which could not be opened.
#[derive(Debug)]
pub struct MappedFiles {
    root: PathBuf,
    open: Mutex<Lru<String, Option<Arc<File>>>>,
    missing: Mutex<BTreeSet<String>>,
}

impl MappedFiles {
    pub fn new(root: &Path) -> MappedFiles {
        MappedFiles {
            root: root.to_owned(),
            open: Mutex::new(Lru::new(MAX_OPEN_FILES)),
            missing: Mutex::new(BTreeSet::new()),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The host path of `path` (as the process saw it) under the root; `None` for a path that
    /// is not absolute or has a `..` component, or names no file (`(deleted)`, `/memfd:…`).
    pub fn host_path(&self, path: &str) -> Option<PathBuf> {
        let p = Path::new(path);
        if !p.is_absolute()
            || path.ends_with(" (deleted)")
            || p.components().any(|c| matches!(c, Component::ParentDir))
        {
            return None;
        }
        Some(self.root.join(p.strip_prefix("/").ok()?))
    }

    /// The open file behind `path`, once; a file that cannot be opened is remembered as missing.
    pub fn open(&self, path: &str) -> Option<Arc<File>> {
        if let Some(f) = self.open.lock().ok()?.get(path) {
            return f.clone();
        }
        let host = self.host_path(path);
        // Non-blocking: a core may name a FIFO (or a device) at a mapped path, and opening a
        // FIFO for reading blocks until a writer comes; only regular files are kept, and
        // their reads ignore the flag.
        let file = host
            .as_ref()
            .and_then(|p| {
                std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(p)
                    .ok()
            })
            .filter(|f| f.metadata().is_ok_and(|m| m.is_file()))
            .map(Arc::new);
        if file.is_none()
            && host.is_some()
            && expected_on_disk(path)
            && let Ok(mut missing) = self.missing.lock()
        {
            missing.insert(path.to_owned());
        }
        if let Ok(mut open) = self.open.lock() {
            open.insert(path.to_owned(), file.clone());
        }
        file
    }

    /// Mapped files that were needed and could not be found under the root, sorted.
    pub fn missing(&self) -> Vec<String> {
        self.missing
            .lock()
            .map(|m| m.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// Whether a mapped path should exist as a file (not a deleted file, a memfd or SysV segment).
fn expected_on_disk(path: &str) -> bool {
    path.starts_with('/')
        && !path.ends_with(" (deleted)")
        && !path.starts_with("/memfd:")
        && !path.starts_with("/SYSV")
        && !path.starts_with("/dev/")
}

/// Target memory from a core file (see the module header).
#[derive(Debug)]
pub struct CoreMemory {
    core: Arc<CoreFile>,
    files: Arc<MappedFiles>,
    cache: RefCell<Lru<u64, Option<Box<[u8]>>>>,
}

impl CoreMemory {
    pub fn new(core: Arc<CoreFile>, files: Arc<MappedFiles>) -> CoreMemory {
        CoreMemory {
            core,
            files,
            cache: RefCell::new(Lru::new(MAX_CACHED_PAGES)),
        }
    }

    pub fn core(&self) -> &CoreFile {
        &self.core
    }

    pub fn files(&self) -> &MappedFiles {
        &self.files
    }

    /// The page at `page_addr`, from the core or from the mapped file (see the module header).
    fn fetch(&self, page_addr: u64) -> Option<Box<[u8]>> {
        let mut page = vec![0u8; PAGE].into_boxed_slice();
        if let Some(l) = self.core.load_for(page_addr) {
            let off = page_addr - l.vaddr;
            if off.checked_add(PAGE as u64)? <= l.filesz {
                self.core
                    .read_exact_at(&mut page, l.offset.checked_add(off)?)
                    .ok()?;
                return Some(page);
            }
        }
        let m = self.core.file_for(page_addr)?;
        let file = self.files.open(&m.path)?;
        let at = m.offset.checked_add(page_addr - m.start)?;
        // Past the end of the file the mapping reads as zeros.
        let mut filled = 0;
        while filled < PAGE {
            match file.read_at(&mut page[filled..], at + filled as u64) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
        Some(page)
    }
}

impl ReadMemory for CoreMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let len = buf.len();
        if len > MAX_READ {
            return Err(MemError::TooLarge { addr, len });
        }
        let fault = MemError::Fault { addr, len };
        let end = addr.checked_add(len as u64).ok_or(fault)?;
        let mut cur = addr;
        while cur < end {
            let page_addr = cur & !(PAGE as u64 - 1);
            let chunk_end = end.min(page_addr.saturating_add(PAGE as u64));
            if !self.cache.borrow().contains(&page_addr) {
                let page = self.fetch(page_addr);
                self.cache.borrow_mut().insert(page_addr, page);
            }
            let mut cache = self.cache.borrow_mut();
            let Some(Some(page)) = cache.get(&page_addr) else {
                return Err(fault);
            };
            let (src, dst, n) = (
                (cur - page_addr) as usize,
                (cur - addr) as usize,
                (chunk_end - cur) as usize,
            );
            buf[dst..dst + n].copy_from_slice(&page[src..src + n]);
            cur = chunk_end;
        }
        Ok(())
    }
}
