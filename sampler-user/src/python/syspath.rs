//! Short file names, as Python programmers see them: relative to the entry of `sys.path` the
//! module was imported from (`sympy/core/expr.py`, `json/decoder.py`, `app.py`), the way
//! py-spy shortens them by default.
//!
//! Owns: [`sys_path`] (the main interpreter's `sys.path`, read from the target's
//! `sys.modules["sys"].__dict__["path"]`) and [`ShortNames`], the per-process rule: the longest
//! absolute `sys.path` entry that is a directory prefix of the file is cut off; a file under
//! none of them keeps its package directories — every parent that holds an `__init__.py`,
//! looked up under the process's root (py-spy's rule) — and loses the rest; a name that is no
//! absolute path (`<frozen importlib._bootstrap>`, `<string>`) is kept as it is.
//! Input: a [`Ctx`] and the main interpreter's address; file names. Output: the short form, or
//! `None` when it would be the name itself.
//! Constraints: at most [`MAX_ENTRIES`] entries of [`MAX_ENTRY_CHARS`] characters each; at
//! most [`MAX_PACKAGE_DEPTH`] `__init__.py` lookups per file, each file looked up once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::code::Ctx;
use super::objects::{Seq, seq_items};
use super::threadnames::{MAX_DICT_ENTRIES, NameError, dict_items, find_str_key};
use super::unicode::read_str_typed;

/// Entries of `sys.path` read.
pub const MAX_ENTRIES: usize = 256;
/// Characters of one entry.
pub const MAX_ENTRY_CHARS: usize = 4096;
/// Package levels looked up above a file outside every `sys.path` entry.
pub const MAX_PACKAGE_DEPTH: usize = 32;
/// Short names remembered per process.
const MAX_CACHED: usize = 1 << 16;

/// The absolute entries of `sys.path` of the interpreter at `interp` (relative ones, such as
/// the `''` of `python -c`, say nothing about a file's absolute name).
pub fn sys_path(ctx: Ctx<'_>, interp: u64) -> Result<Vec<String>, NameError> {
    let (mem, l) = (ctx.mem, ctx.layout);
    let modules = mem.read_u64(interp.wrapping_add(l.interp.imports_modules))?;
    if modules == 0 {
        return Err(NameError::Missing("sys.modules"));
    }
    let sys = find_str_key(ctx, &dict_items(ctx, modules, MAX_DICT_ENTRIES)?, "sys")?;
    let md_dict = mem.read_u64(sys.wrapping_add(l.dict.module_dict))?;
    let path = find_str_key(ctx, &dict_items(ctx, md_dict, MAX_DICT_ENTRIES)?, "path")?;
    let (items, _) = seq_items(ctx, path, Seq::List, MAX_ENTRIES)?;
    Ok(items
        .into_iter()
        .filter_map(|s| read_str_typed(ctx, s, MAX_ENTRY_CHARS).ok())
        .filter(|s| s.starts_with('/'))
        .collect())
}

/// The short-name rule of one process.
#[derive(Debug, Default)]
pub struct ShortNames {
    /// Absolute `sys.path` entries without trailing `/`, longest first.
    prefixes: Vec<String>,
    /// Where the process's files are seen from here (`/proc/PID/root`); `None`: no package
    /// lookups.
    root: Option<PathBuf>,
    cache: HashMap<String, Option<String>>,
}

impl ShortNames {
    /// The rule for `sys_path` (as [`sys_path`] returns it), with package lookups under
    /// `root`.
    pub fn new(sys_path: &[String], root: Option<PathBuf>) -> ShortNames {
        let mut prefixes: Vec<String> = sys_path
            .iter()
            .map(|p| p.trim_end_matches('/').to_string())
            .filter(|p| !p.is_empty())
            .collect();
        prefixes.sort_by_key(|p| std::cmp::Reverse(p.len()));
        prefixes.dedup();
        ShortNames {
            prefixes,
            root,
            cache: HashMap::new(),
        }
    }

    /// The short form of `file`, `None` when it is `file` itself.
    pub fn short(&mut self, file: &str) -> Option<String> {
        if let Some(hit) = self.cache.get(file) {
            return hit.clone();
        }
        let short = self.compute(file);
        if self.cache.len() >= MAX_CACHED {
            self.cache.clear();
        }
        self.cache.insert(file.to_string(), short.clone());
        short
    }

    fn compute(&self, file: &str) -> Option<String> {
        if !file.starts_with('/') {
            return None;
        }
        for p in &self.prefixes {
            if let Some(rest) = file.strip_prefix(p.as_str())
                && let Some(rest) = rest.strip_prefix('/')
                && !rest.is_empty()
            {
                return Some(rest.to_string());
            }
        }
        let root = self.root.as_deref()?;
        // py-spy's rule: keep the package directories (those with an `__init__.py`).
        let path = Path::new(file);
        let mut top = path.parent()?;
        for _ in 0..MAX_PACKAGE_DEPTH {
            let inner = top.strip_prefix("/").unwrap_or(top);
            if !root.join(inner).join("__init__.py").is_file() {
                break;
            }
            match top.parent() {
                Some(up) => top = up,
                None => break,
            }
        }
        let rest = path.strip_prefix(top).ok()?.to_str()?;
        (!rest.is_empty() && rest != file).then(|| rest.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_entry_wins_and_odd_names_stay() {
        let mut s = ShortNames::new(
            &[
                "/usr/lib/python3.12".into(),
                "/usr/lib/python3.12/site-packages/".into(),
                "/home/u/proj".into(),
            ],
            None,
        );
        assert_eq!(
            s.short("/usr/lib/python3.12/site-packages/sympy/core/expr.py")
                .as_deref(),
            Some("sympy/core/expr.py")
        );
        assert_eq!(
            s.short("/usr/lib/python3.12/json/decoder.py").as_deref(),
            Some("json/decoder.py")
        );
        assert_eq!(s.short("/home/u/proj/app.py").as_deref(), Some("app.py"));
        // A name that only starts like an entry is not under it.
        assert_eq!(s.short("/home/u/project/app.py"), None);
        assert_eq!(s.short("<frozen importlib._bootstrap>"), None);
        assert_eq!(s.short("<string>"), None);
        assert_eq!(s.short("/usr/lib/python3.12"), None);
    }

    #[test]
    fn outside_sys_path_packages_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let pkg = dir.path().join("srv/app/pkg/sub");
        std::fs::create_dir_all(&pkg).unwrap();
        for d in ["srv/app/pkg", "srv/app/pkg/sub"] {
            std::fs::write(dir.path().join(d).join("__init__.py"), b"").unwrap();
        }
        let mut s = ShortNames::new(&[], Some(dir.path().to_path_buf()));
        assert_eq!(
            s.short("/srv/app/pkg/sub/mod.py").as_deref(),
            Some("pkg/sub/mod.py")
        );
        assert_eq!(s.short("/srv/app/run.py").as_deref(), Some("run.py"));
        // Without a root to look at, nothing is guessed.
        let mut blind = ShortNames::new(&[], None);
        assert_eq!(blind.short("/srv/app/pkg/sub/mod.py"), None);
    }
}
