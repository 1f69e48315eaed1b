//! Output formats. Each format takes up one file and renders the same [`Profile`].
//!
//! Owns: [`Format`], the format-by-extension rule, and [`write_atomically`], which writes to a
//! temporary name beside the destination and renames it, so a failed run never leaves half a
//! file.

mod collapsed;
mod flamegraph;
pub mod pprof;
mod speedscope;

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::profile::Profile;

/// A renderer of a [`Profile`] into one file format.
pub trait Renderer {
    /// Writes the profile.
    fn render(&self, profile: &Profile, out: &mut dyn Write) -> io::Result<()>;
}

/// Output formats of `record`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Interactive SVG flame graph (inferno).
    Flamegraph,
    /// Folded stacks, one `a;b;c count` line per stack.
    Collapsed,
    /// speedscope JSON (<https://www.speedscope.app/file-format-schema.json>).
    Speedscope,
    /// gzipped pprof `profile.proto` (go tool pprof, Pyroscope, Parca).
    Pprof,
    /// pyebpf's own saved profile: every sample with its metadata (see [`crate::saved`]).
    Pyebpf,
}

impl Format {
    /// Every format with its CLI name.
    pub const ALL: [(Format, &'static str); 5] = [
        (Format::Flamegraph, "flamegraph"),
        (Format::Collapsed, "collapsed"),
        (Format::Speedscope, "speedscope"),
        (Format::Pprof, "pprof"),
        (Format::Pyebpf, "pyebpf"),
    ];

    /// Parses a CLI name (`flamegraph`/`svg`, `collapsed`/`raw`, `speedscope`).
    pub fn from_name(name: &str) -> Option<Format> {
        match name {
            "flamegraph" | "svg" => Some(Format::Flamegraph),
            "collapsed" | "raw" | "folded" => Some(Format::Collapsed),
            "speedscope" => Some(Format::Speedscope),
            "pprof" => Some(Format::Pprof),
            "pyebpf" => Some(Format::Pyebpf),
            _ => None,
        }
    }

    /// The format implied by a file name's extension, if any.
    pub fn from_path(path: &Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            // Also covers `.speedscope.json`.
            "json" => Some(Format::Speedscope),
            "svg" => Some(Format::Flamegraph),
            "txt" | "folded" | "collapsed" => Some(Format::Collapsed),
            // `.pb.gz` and `.pprof`.
            "gz" if path.to_string_lossy().ends_with(".pb.gz") => Some(Format::Pprof),
            "pprof" => Some(Format::Pprof),
            "pyebpf" => Some(Format::Pyebpf),
            _ => None,
        }
    }

    /// The default file extension.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Flamegraph => "svg",
            Format::Collapsed => "txt",
            Format::Speedscope => "speedscope.json",
            Format::Pprof => "pb.gz",
            Format::Pyebpf => "pyebpf",
        }
    }

    /// What the end-of-run message calls the output.
    pub fn describe(self) -> &'static str {
        match self {
            Format::Flamegraph => "flame graph",
            Format::Collapsed => "collapsed stacks",
            Format::Speedscope => "speedscope profile",
            Format::Pprof => "pprof profile",
            Format::Pyebpf => "saved profile",
        }
    }

    fn renderer(self) -> Box<dyn Renderer> {
        match self {
            Format::Flamegraph => Box::new(flamegraph::Flamegraph),
            Format::Collapsed => Box::new(collapsed::Collapsed),
            Format::Speedscope => Box::new(speedscope::Speedscope),
            Format::Pprof => Box::new(pprof::Pprof),
            Format::Pyebpf => Box::new(crate::saved::Saved),
        }
    }

    /// Renders `profile` in this format into `out`.
    pub fn render(self, profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
        self.renderer().render(profile, out)
    }
}

/// The temporary name used while writing `dest`.
fn temp_name(dest: &Path) -> PathBuf {
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dest.with_file_name(format!(".{name}.pyebpf-tmp.{}", std::process::id()))
}

/// Checks, before sampling starts, that `dest` can be written: creates and removes the
/// temporary file that [`write_atomically`] will use.
pub fn check_writable(dest: &Path) -> io::Result<()> {
    if dest.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::IsADirectory,
            "is a directory",
        ));
    }
    let tmp = temp_name(dest);
    std::fs::File::create(&tmp)?;
    std::fs::remove_file(&tmp)
}

/// Writes through `write` into a temporary file beside `dest`, then renames it to `dest`.
/// On any error the temporary file is removed and `dest` is untouched.
pub fn write_atomically(
    dest: &Path,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    let tmp = temp_name(dest);
    let result = (|| {
        let file = std::fs::File::create(&tmp)?;
        let mut buf = io::BufWriter::new(file);
        write(&mut buf)?;
        let file = buf.into_inner().map_err(io::IntoInnerError::into_error)?;
        file.sync_all()?;
        std::fs::rename(&tmp, dest)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::profile::{Frame, FrameKind, Profile, RunMeta, Sample};

    /// (comm, pid, frames, samples) of the demo profile.
    type DemoStack<'a> = (&'a str, u32, &'a [(FrameKind, &'a str)], u32);

    /// A small profile with two processes, Python, native and kernel frames.
    pub(crate) fn demo_profile() -> Profile {
        let mut p = Profile::new(RunMeta {
            rate_hz: 99,
            ..RunMeta::default()
        });
        let stacks: [DemoStack<'_>; 3] = [
            (
                "app",
                10,
                &[(FrameKind::Native, "main"), (FrameKind::Native, "hot")],
                3,
            ),
            (
                "app",
                10,
                &[(FrameKind::Native, "main"), (FrameKind::Kernel, "vfs_read")],
                1,
            ),
            ("py", 20, &[(FrameKind::Python, "f<é;>")], 2),
        ];
        let mut t = 0;
        for (comm, pid, frames, n) in stacks {
            let mut ids =
                vec![p.intern_frame(Frame::new(FrameKind::Process, format!("{comm} ({pid})")))];
            for (k, name) in frames {
                let mut f = Frame::new(*k, *name);
                if *k == FrameKind::Python {
                    f.file = Some("/x/y.py".into());
                    f.line = Some(3);
                }
                ids.push(p.intern_frame(f));
            }
            let stack = p.intern_stack(&ids);
            for _ in 0..n {
                t += 10_000_000;
                p.add_sample(Sample {
                    stack,
                    time_ns: t,
                    pid,
                    tid: pid,
                    cpu: 0,
                    comm: comm.into(),
                    thread_name: comm.into(),
                    gil: crate::profile::GilState::Unknown,
                });
            }
        }
        p
    }

    #[test]
    fn format_from_path() {
        assert_eq!(
            Format::from_path(Path::new("a/out.svg")),
            Some(Format::Flamegraph)
        );
        assert_eq!(
            Format::from_path(Path::new("out.txt")),
            Some(Format::Collapsed)
        );
        assert_eq!(
            Format::from_path(Path::new("p.speedscope.json")),
            Some(Format::Speedscope)
        );
        assert_eq!(Format::from_path(Path::new("p.bin")), None);
    }

    #[test]
    fn atomic_write_leaves_nothing_on_error() {
        let dir = std::env::temp_dir().join(format!("pyebpf-out-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dest = dir.join("x.svg");
        let err = write_atomically(&dest, |w| {
            w.write_all(b"half")?;
            Err(io::Error::other("boom"))
        });
        assert!(err.is_err());
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "no file left behind"
        );
        write_atomically(&dest, |w| w.write_all(b"whole")).unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"whole");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn check_writable_refuses_missing_dir() {
        assert!(check_writable(Path::new("/nonexistent-dir-pyebpf/x.svg")).is_err());
        assert!(check_writable(&std::env::temp_dir()).is_err());
    }
}
