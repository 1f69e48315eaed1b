//! Output formats. Each format takes up one file and renders the same [`Profile`].
//!
//! Owns: [`Format`], the format-by-extension rule, and [`OutputFile`] ([`file`]), the one way
//! pyebpf creates files: resolved before sampling, written to an unpredictable temporary name
//! beside the destination and renamed, so a failed run never leaves half a file and a run as
//! root cannot be turned against other files.

mod collapsed;
pub mod file;
mod flamegraph;
pub mod pprof;
mod speedscope;

use std::io::{self, Write};
use std::path::Path;

pub use file::{OutputError, OutputFile};

use crate::profile::Profile;

/// A renderer of a [`Profile`] into one file format.
pub trait Renderer {
    /// Writes the profile.
    fn render(&self, profile: &Profile, out: &mut dyn Write) -> io::Result<()>;
}

/// The saved format (`-f pyebpf`) of a whole profile; `record` streams it instead
/// ([`crate::saved::SavedWriter`]).
struct SavedProfile;

impl Renderer for SavedProfile {
    fn render(&self, profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
        crate::saved::writer::write_profile(profile, out)
    }
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
            Format::Pyebpf => Box::new(SavedProfile),
        }
    }

    /// Renders `profile` in this format into `out`.
    pub fn render(self, profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
        self.renderer().render(profile, out)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::profile::{Frame, FrameKind, NamedSample, Profile, RunMeta};

    /// (comm, pid, frames, samples) of the demo profile.
    type DemoStack<'a> = (&'a str, u32, &'a [(FrameKind, &'a str)], u32);

    /// A small profile with two processes, Python, native and kernel frames.
    pub(crate) fn demo_profile() -> Profile {
        let mut p = Profile::new(RunMeta {
            rate_hz: 99,
            ..RunMeta::default()
        });
        p.keep_timeline();
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
                p.add_sample(NamedSample {
                    stack,
                    time_ns: t,
                    pid,
                    tid: pid,
                    cpu: 0,
                    comm: comm.into(),
                    thread_name: comm.into(),
                    gil: crate::profile::GilState::Unknown,
                    state: crate::profile::ThreadState::OnCpu,
                    weight: 1,
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
}
