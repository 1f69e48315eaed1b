//! pprof output: a gzipped `perftools.profiles.Profile` (Google's `profile.proto`), encoded with
//! prost, for `go tool pprof`, Grafana Pyroscope and Parca.
//!
//! Owns: the hand-written profile.proto messages ([`proto`]), the mapping of a [`Profile`] onto
//! them, and [`decode`] (gunzip + decode, for tests and tools).
//!
//! Mapping: sample types `samples/count` and `cpu/nanoseconds` (period `1e9 / rate`); one
//! `Function` per distinct (kind, name, file, module), with the source file for Python frames,
//! the source file or else the module for native frames and `[kernel.kallsyms]` for kernel
//! frames; one `Location` (one `Line`) per frame used; one `Mapping` per native module and one
//! for the kernel. Samples are aggregated per (stack, pid, tid, comm, thread name), leaf first as
//! pprof wants, with numeric labels `pid`, `tid` and string labels `comm`, `thread`. The
//! synthetic `comm (pid)` and thread frames stay frames, so stack counts match every other
//! format.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::sync::Arc;

use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use prost::Message;

use super::Renderer;
use crate::profile::{FrameId, FrameKind, Profile, StackId, ThreadState};

/// The `perftools.profiles` messages, field numbers as in Google's `proto/profile.proto`.
pub mod proto {
    /// A profile: samples, their locations, functions and mappings, and a string table.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        /// What each `Sample.value` means.
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        /// The samples.
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        /// Loaded objects.
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        /// Program locations.
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        /// Functions referenced by locations.
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        /// Strings; index 0 is always "".
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        /// Regexp (string index) of frames to drop.
        #[prost(int64, tag = "7")]
        pub drop_frames: i64,
        /// Regexp (string index) of frames to keep.
        #[prost(int64, tag = "8")]
        pub keep_frames: i64,
        /// Start of collection, ns since the Unix epoch.
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        /// Duration of the profile, ns.
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        /// Kind of events between samples.
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        /// Events between samples.
        #[prost(int64, tag = "12")]
        pub period: i64,
        /// Free-form comments (string indices).
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        /// Preferred sample type (string index of its type).
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    /// Type and unit of a value (string indices).
    #[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
    pub struct ValueType {
        /// Type, e.g. "cpu".
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        /// Unit, e.g. "nanoseconds".
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    /// Values recorded for one stack (and label set).
    #[derive(Clone, PartialEq, Eq, prost::Message)]
    pub struct Sample {
        /// Location ids, leaf first.
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        /// One value per `Profile.sample_type`.
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        /// Labels.
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    /// A sample label: a string or a number under a key (string indices).
    #[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
    pub struct Label {
        /// Key.
        #[prost(int64, tag = "1")]
        pub key: i64,
        /// String value.
        #[prost(int64, tag = "2")]
        pub str: i64,
        /// Numeric value.
        #[prost(int64, tag = "3")]
        pub num: i64,
        /// Unit of `num`.
        #[prost(int64, tag = "4")]
        pub num_unit: i64,
    }

    /// A loaded object.
    #[allow(clippy::struct_excessive_bools, reason = "the fields of profile.proto")]
    #[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
    pub struct Mapping {
        /// Unique non-zero id.
        #[prost(uint64, tag = "1")]
        pub id: u64,
        /// Start address.
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        /// End address.
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        /// File offset of the start.
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        /// Object file name (string index).
        #[prost(int64, tag = "5")]
        pub filename: i64,
        /// Build id (string index).
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        /// Locations carry function names.
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        /// Functions carry file names.
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        /// Lines carry line numbers.
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        /// Locations list inlined frames.
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }

    /// A program location.
    #[derive(Clone, PartialEq, Eq, prost::Message)]
    pub struct Location {
        /// Unique non-zero id.
        #[prost(uint64, tag = "1")]
        pub id: u64,
        /// Mapping id, 0 when none.
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        /// Instruction address, when known.
        #[prost(uint64, tag = "3")]
        pub address: u64,
        /// Function and line (inlined callees first).
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
        /// Several symbols share this address.
        #[prost(bool, tag = "5")]
        pub is_folded: bool,
    }

    /// A function and line within a location.
    #[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
    pub struct Line {
        /// Function id.
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        /// Source line, 0 when unknown.
        #[prost(int64, tag = "2")]
        pub line: i64,
        /// Source column, 0 when unknown.
        #[prost(int64, tag = "3")]
        pub column: i64,
    }

    /// A function.
    #[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
    pub struct Function {
        /// Unique non-zero id.
        #[prost(uint64, tag = "1")]
        pub id: u64,
        /// Human-readable name (string index).
        #[prost(int64, tag = "2")]
        pub name: i64,
        /// System name (string index).
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        /// Source file (string index).
        #[prost(int64, tag = "4")]
        pub filename: i64,
        /// First line of the function, 0 when unknown.
        #[prost(int64, tag = "5")]
        pub start_line: i64,
    }
}

/// The file name pprof shows for kernel frames (perf's convention).
pub const KERNEL_FILE: &str = "[kernel.kallsyms]";

/// pprof renderer.
pub struct Pprof;

impl Renderer for Pprof {
    fn render(&self, profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
        let bytes = build(profile).encode_to_vec();
        let mut gz = GzEncoder::new(out, Compression::default());
        gz.write_all(&bytes)?;
        gz.finish()?;
        Ok(())
    }
}

/// Most bytes [`decode`] inflates: pprof files are small, a bigger one is not ours.
const MAX_DECODED: u64 = 1 << 30;

/// Gunzips and decodes a pprof file (a plain, not gzipped, encoding is accepted too).
pub fn decode(bytes: &[u8]) -> io::Result<proto::Profile> {
    let raw;
    let body = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut buf = Vec::new();
        GzDecoder::new(bytes)
            .take(MAX_DECODED)
            .read_to_end(&mut buf)?;
        raw = buf;
        &raw[..]
    } else {
        bytes
    };
    proto::Profile::decode(body).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// The string table under construction: "" at index 0, each string once.
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        let mut s = Strings::default();
        s.get("");
        s
    }

    fn get(&mut self, s: &str) -> i64 {
        if let Some(i) = self.index.get(s) {
            return *i;
        }
        let i = i64::try_from(self.table.len()).unwrap_or(i64::MAX);
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// Nanoseconds in a second.
const NS_PER_S: u64 = 1_000_000_000;

/// A non-negative float number of seconds in ns, saturating; 0 for NaN and negatives.
fn seconds_to_ns(s: f64) -> i64 {
    if s.is_finite() && s > 0.0 {
        #[allow(
            clippy::cast_possible_truncation,
            reason = "clamped to the i64 range first; sub-ns precision is irrelevant"
        )]
        let ns = (s * 1e9).min(9.0e18) as i64;
        ns
    } else {
        0
    }
}

/// (stack, pid, tid, comm, thread name): what a pprof `Sample` aggregates over.
type SampleKey<'a> = (StackId, u32, u32, &'a str, &'a str, ThreadState);

/// (kind, name, file, module): what makes a pprof `Function` distinct.
type FunctionKey = (FrameKind, Arc<str>, Option<Arc<str>>, Option<Arc<str>>);

/// Builds the pprof message for `profile`.
pub fn build(profile: &Profile) -> proto::Profile {
    let mut strings = Strings::new();
    let mut out = proto::Profile::default();
    let samples_t = proto::ValueType {
        r#type: strings.get("samples"),
        unit: strings.get("count"),
    };
    let cpu_t = proto::ValueType {
        // A wall-clock run's time is off-CPU time too.
        r#type: strings.get(if profile.meta.idle { "wall" } else { "cpu" }),
        unit: strings.get("nanoseconds"),
    };
    out.sample_type = vec![samples_t, cpu_t];
    out.period_type = Some(cpu_t);
    out.default_sample_type = cpu_t.r#type;
    let period = i64::try_from(NS_PER_S / profile.meta.rate_hz.max(1)).unwrap_or(i64::MAX);
    out.period = period;
    out.time_nanos =
        i64::try_from(profile.meta.start_unix_s.saturating_mul(NS_PER_S)).unwrap_or(i64::MAX);
    out.duration_nanos = seconds_to_ns(profile.meta.duration_s);
    out.comment = comments(profile).iter().map(|c| strings.get(c)).collect();

    let mut tables = Tables::default();
    // The profile's counts per (stack, pid, tid, comm, thread name, state), in first-seen
    // order (its keys also tell the GIL state apart, which pprof does not show).
    let mut keys: HashMap<SampleKey<'_>, usize> = HashMap::new();
    let mut counts: Vec<(SampleKey<'_>, i64)> = Vec::new();
    for (k, c) in profile.counts() {
        let key = (
            k.stack,
            k.pid,
            k.tid,
            &**profile.comm(k),
            &**profile.thread(k),
            k.state,
        );
        let i = *keys.entry(key).or_insert_with(|| {
            counts.push((key, 0));
            counts.len() - 1
        });
        counts[i].1 = counts[i]
            .1
            .saturating_add(i64::try_from(c.weight).unwrap_or(i64::MAX));
    }
    let state_k = strings.get("state");
    let (pid_k, tid_k, comm_k, thread_k) = (
        strings.get("pid"),
        strings.get("tid"),
        strings.get("comm"),
        strings.get("thread"),
    );
    for ((stack, pid, tid, comm, thread, state), count) in counts {
        let location_id = profile
            .stack(stack)
            .iter()
            .rev()
            .map(|f| tables.location(profile, *f, &mut strings))
            .collect();
        out.sample.push(proto::Sample {
            location_id,
            value: vec![count, count.saturating_mul(period)],
            label: vec![
                proto::Label {
                    key: pid_k,
                    num: i64::from(pid),
                    ..proto::Label::default()
                },
                proto::Label {
                    key: tid_k,
                    num: i64::from(tid),
                    ..proto::Label::default()
                },
                proto::Label {
                    key: comm_k,
                    str: strings.get(comm),
                    ..proto::Label::default()
                },
                proto::Label {
                    key: thread_k,
                    str: strings.get(thread),
                    ..proto::Label::default()
                },
            ],
        });
        if profile.meta.idle
            && let Some(sample) = out.sample.last_mut()
        {
            sample.label.push(proto::Label {
                key: state_k,
                str: strings.get(state.as_str()),
                ..proto::Label::default()
            });
        }
    }
    out.mapping = tables.mappings;
    out.location = tables.locations;
    out.function = tables.functions;
    out.string_table = strings.table;
    out
}

/// Free-form comments: the profiler, its command line and the run's facts.
fn comments(profile: &Profile) -> Vec<String> {
    let m = &profile.meta;
    let mut c = vec![concat!("pyebpf ", env!("CARGO_PKG_VERSION")).to_string()];
    if !m.command_line.is_empty() {
        c.push(format!("command line: {}", m.command_line.join(" ")));
    }
    if !m.host.is_empty() || !m.kernel.is_empty() {
        c.push(format!("host: {}, kernel: {}", m.host, m.kernel));
    }
    c.push(format!(
        "{} samples{} at {} Hz on {} CPUs, lost samples: {}",
        profile.total_weight(),
        if m.idle { " (wall clock: --idle)" } else { "" },
        m.rate_hz,
        m.cpus,
        m.lost_samples
    ));
    for (kind, n) in m.errors.named() {
        c.push(format!("errors: {kind}: {n}"));
    }
    c
}

/// Functions, locations and mappings, each created on first use with ids 1, 2, …
#[derive(Default)]
struct Tables {
    functions: Vec<proto::Function>,
    function_ids: HashMap<FunctionKey, u64>,
    locations: Vec<proto::Location>,
    location_ids: HashMap<FrameId, u64>,
    mappings: Vec<proto::Mapping>,
    mapping_ids: HashMap<Arc<str>, u64>,
}

/// The next 1-based id of a table of `len` entries.
fn next_id(len: usize) -> u64 {
    u64::try_from(len).unwrap_or(u64::MAX - 1) + 1
}

impl Tables {
    /// The location of frame `id`, created on first use.
    fn location(&mut self, profile: &Profile, id: FrameId, strings: &mut Strings) -> u64 {
        if let Some(l) = self.location_ids.get(&id) {
            return *l;
        }
        let frame = profile.frame(id);
        let (filename, object): (Option<&str>, Option<&str>) = match frame.kind {
            FrameKind::Python => (frame.display_file(profile.file_names), None),
            FrameKind::Native => {
                let module = frame.module.as_deref();
                (frame.file.as_deref().or(module), module)
            }
            FrameKind::Kernel => (Some(KERNEL_FILE), Some(KERNEL_FILE)),
            FrameKind::Process | FrameKind::Thread | FrameKind::Marker | FrameKind::State => {
                (None, None)
            }
        };
        let key: FunctionKey = (
            frame.kind,
            frame.name.clone(),
            frame.file.clone(),
            frame.module.clone(),
        );
        let function_id = if let Some(f) = self.function_ids.get(&key) {
            *f
        } else {
            let fid = next_id(self.functions.len());
            let name = strings.get(&frame.name);
            self.functions.push(proto::Function {
                id: fid,
                name,
                system_name: name,
                filename: filename.map_or(0, |f| strings.get(f)),
                start_line: 0,
            });
            self.function_ids.insert(key, fid);
            fid
        };
        let mapping_id = match object {
            Some(o) => self.mapping(o, frame.file.is_some(), frame.line.is_some(), strings),
            None => 0,
        };
        let lid = next_id(self.locations.len());
        self.locations.push(proto::Location {
            id: lid,
            mapping_id,
            line: vec![proto::Line {
                function_id,
                line: frame.line.map_or(0, i64::from),
                column: 0,
            }],
            ..proto::Location::default()
        });
        self.location_ids.insert(id, lid);
        lid
    }

    /// The mapping of object `name`, created on first use. Its locations are symbolized
    /// already (`has_functions`), so pprof never looks for the object file.
    fn mapping(&mut self, name: &str, files: bool, lines: bool, strings: &mut Strings) -> u64 {
        let id = if let Some(m) = self.mapping_ids.get(name) {
            *m
        } else {
            let id = next_id(self.mappings.len());
            self.mappings.push(proto::Mapping {
                id,
                filename: strings.get(name),
                has_functions: true,
                ..proto::Mapping::default()
            });
            self.mapping_ids.insert(name.into(), id);
            id
        };
        if let Some(m) = usize::try_from(id - 1)
            .ok()
            .and_then(|i| self.mappings.get_mut(i))
        {
            m.has_filenames |= files;
            m.has_line_numbers |= lines;
        }
        id
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::output::tests::demo_profile;
    use crate::profile::{GilState, NamedSample, RunMeta};

    fn render(profile: &Profile) -> Vec<u8> {
        let mut buf = Vec::new();
        Pprof.render(profile, &mut buf).unwrap();
        buf
    }

    fn string(p: &proto::Profile, i: i64) -> &str {
        let i = usize::try_from(i).expect("negative string index");
        p.string_table
            .get(i)
            .unwrap_or_else(|| panic!("string index {i} out of range"))
    }

    /// Checks every id and index of `p`: non-zero, unique, in range.
    fn check_valid(p: &proto::Profile) {
        assert_eq!(p.string_table.first().map(String::as_str), Some(""));
        let in_range = |i: i64| usize::try_from(i).is_ok_and(|i| i < p.string_table.len());
        for (what, ids) in [
            (
                "function",
                p.function.iter().map(|f| f.id).collect::<Vec<_>>(),
            ),
            ("location", p.location.iter().map(|l| l.id).collect()),
            ("mapping", p.mapping.iter().map(|m| m.id).collect()),
        ] {
            let mut sorted = ids.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), ids.len(), "{what} ids not unique: {ids:?}");
            assert!(ids.iter().all(|i| *i != 0), "{what} id 0: {ids:?}");
        }
        for f in &p.function {
            assert!(in_range(f.name) && f.name != 0, "function name {f:?}");
            assert!(in_range(f.system_name) && in_range(f.filename), "{f:?}");
        }
        for m in &p.mapping {
            assert!(
                in_range(m.filename) && m.filename != 0 && m.has_functions,
                "{m:?}"
            );
        }
        for l in &p.location {
            assert!(
                l.mapping_id == 0 || p.mapping.iter().any(|m| m.id == l.mapping_id),
                "{l:?}"
            );
            assert_eq!(l.line.len(), 1, "{l:?}");
            assert!(
                p.function.iter().any(|f| f.id == l.line[0].function_id),
                "{l:?}"
            );
        }
        for t in p.sample_type.iter().chain(&p.period_type) {
            assert!(in_range(t.r#type) && in_range(t.unit), "{t:?}");
        }
        assert!(p.comment.iter().all(|c| in_range(*c) && *c != 0));
        for s in &p.sample {
            assert_eq!(s.value.len(), p.sample_type.len(), "{s:?}");
            assert!(!s.location_id.is_empty());
            for l in &s.location_id {
                assert!(p.location.iter().any(|x| x.id == *l), "{s:?}");
            }
            for l in &s.label {
                assert!(in_range(l.key) && l.key != 0 && in_range(l.str), "{l:?}");
            }
        }
    }

    /// Stack counts of `p`, root first, each frame as `name|file|line`.
    fn decoded_stacks(p: &proto::Profile) -> BTreeMap<Vec<String>, i64> {
        let mut out = BTreeMap::new();
        for s in &p.sample {
            let frames = s
                .location_id
                .iter()
                .rev()
                .map(|id| {
                    let l = p.location.iter().find(|l| l.id == *id).unwrap();
                    let f = p
                        .function
                        .iter()
                        .find(|f| f.id == l.line[0].function_id)
                        .unwrap();
                    format!(
                        "{}|{}|{}",
                        string(p, f.name),
                        string(p, f.filename),
                        l.line[0].line
                    )
                })
                .collect();
            *out.entry(frames).or_default() += s.value[0];
        }
        out
    }

    /// The same view of the model: `Profile::stack_counts()`.
    fn expected_stacks(profile: &Profile) -> BTreeMap<Vec<String>, i64> {
        let mut out = BTreeMap::new();
        for (sid, n) in profile.stack_counts() {
            let frames = profile
                .stack(sid)
                .iter()
                .map(|id| {
                    let f = profile.frame(*id);
                    let file = match f.kind {
                        FrameKind::Kernel => KERNEL_FILE,
                        FrameKind::Native => {
                            f.file.as_deref().or(f.module.as_deref()).unwrap_or("")
                        }
                        FrameKind::Python => f.file.as_deref().unwrap_or(""),
                        _ => "",
                    };
                    format!("{}|{file}|{}", f.name, f.line.unwrap_or(0))
                })
                .collect();
            *out.entry(frames).or_default() += i64::try_from(n).unwrap();
        }
        out
    }

    #[test]
    fn round_trip_is_valid_and_counts_match() {
        let profile = demo_profile();
        let bytes = render(&profile);
        assert!(bytes.starts_with(&[0x1f, 0x8b]), "gzipped");
        let p = decode(&bytes).unwrap();
        assert_eq!(p, build(&profile));
        check_valid(&p);
        // Sample types and period.
        let types: Vec<(&str, &str)> = p
            .sample_type
            .iter()
            .map(|t| (string(&p, t.r#type), string(&p, t.unit)))
            .collect();
        assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
        let pt = p.period_type.unwrap();
        assert_eq!(
            (string(&p, pt.r#type), string(&p, pt.unit)),
            ("cpu", "nanoseconds")
        );
        assert_eq!(p.period, 1_000_000_000 / 99);
        // Values.
        let total: i64 = p.sample.iter().map(|s| s.value[0]).sum();
        assert_eq!(total, i64::try_from(profile.total_weight()).unwrap());
        for s in &p.sample {
            assert_eq!(s.value[1], s.value[0] * p.period, "{s:?}");
        }
        // Per-stack counts, leaf-first location lists read back root first.
        assert_eq!(decoded_stacks(&p), expected_stacks(&profile));
        // Every location is used once per frame: one per interned frame.
        assert_eq!(p.location.len(), profile.frames().len());
        // The first frame of every stack (the root) is the synthetic process frame.
        for s in &p.sample {
            let root = p
                .location
                .iter()
                .find(|l| Some(&l.id) == s.location_id.last())
                .unwrap();
            let f = p
                .function
                .iter()
                .find(|f| f.id == root.line[0].function_id)
                .unwrap();
            assert!(string(&p, f.name).ends_with(')'), "{}", string(&p, f.name));
        }
    }

    #[test]
    fn functions_files_and_mappings() {
        let p = decode(&render(&demo_profile())).unwrap();
        let by_name = |n: &str| {
            p.function
                .iter()
                .find(|f| string(&p, f.name) == n)
                .unwrap_or_else(|| panic!("no function {n}"))
        };
        let location_of = |function: u64| {
            p.location
                .iter()
                .find(|l| l.line[0].function_id == function)
                .unwrap()
        };
        assert_eq!(string(&p, by_name("f<é;>").filename), "/x/y.py");
        assert_eq!(string(&p, by_name("vfs_read").filename), KERNEL_FILE);
        assert_eq!(string(&p, by_name("app (10)").filename), "");
        // Python line numbers are on the lines.
        let python = location_of(by_name("f<é;>").id);
        assert_eq!(python.line[0].line, 3);
        assert_eq!(python.mapping_id, 0);
        // The kernel has a mapping of its own; every name is one Function.
        let kernel = location_of(by_name("vfs_read").id);
        let mapping = p
            .mapping
            .iter()
            .find(|m| m.id == kernel.mapping_id)
            .unwrap();
        assert_eq!(string(&p, mapping.filename), KERNEL_FILE);
        assert_eq!(p.function.len(), 6, "{:?}", p.function);
    }

    #[test]
    fn labels_and_aggregation_per_thread() {
        let mut profile = demo_profile();
        // Two more samples of process 20's stack, from another thread.
        let stack = profile
            .counts()
            .iter()
            .find(|(k, _)| k.pid == 20)
            .unwrap()
            .0
            .stack;
        for _ in 0..2 {
            profile.add_sample(NamedSample {
                stack,
                time_ns: 1,
                pid: 20,
                tid: 21,
                cpu: 1,
                comm: "py".into(),
                thread_name: "worker".into(),
                gil: GilState::Held,
                state: crate::profile::ThreadState::OnCpu,
                weight: 1,
            });
        }
        let p = decode(&render(&profile)).unwrap();
        check_valid(&p);
        let labels = |s: &proto::Sample| {
            let mut m = BTreeMap::new();
            for l in &s.label {
                let v = if l.str == 0 {
                    l.num.to_string()
                } else {
                    string(&p, l.str).to_string()
                };
                assert!(m.insert(string(&p, l.key).to_string(), v).is_none());
            }
            m
        };
        let mut got: Vec<(BTreeMap<String, String>, i64)> =
            p.sample.iter().map(|s| (labels(s), s.value[0])).collect();
        got.sort();
        let want = |pid: u32, tid: u32, comm: &str, thread: &str, n: i64| {
            let m: BTreeMap<String, String> = [
                ("pid", pid.to_string()),
                ("tid", tid.to_string()),
                ("comm", comm.to_string()),
                ("thread", thread.to_string()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
            (m, n)
        };
        let mut expected = vec![
            want(10, 10, "app", "app", 3),
            want(10, 10, "app", "app", 1),
            want(20, 20, "py", "py", 2),
            want(20, 21, "py", "worker", 2),
        ];
        expected.sort();
        assert_eq!(got, expected);
        assert_eq!(decoded_stacks(&p), expected_stacks(&profile));
    }

    #[test]
    fn run_metadata_and_zero_rate() {
        let mut profile = Profile::new(RunMeta {
            start_unix_s: 1_700_000_000,
            duration_s: 2.5,
            rate_hz: 0,
            command_line: vec!["pyebpf".into(), "record".into(), "-a".into()],
            ..RunMeta::default()
        });
        let p = decode(&render(&profile)).unwrap();
        check_valid(&p);
        assert!(p.sample.is_empty());
        assert_eq!(p.time_nanos, 1_700_000_000_000_000_000);
        assert_eq!(p.duration_nanos, 2_500_000_000);
        assert_eq!(
            p.period, 1_000_000_000,
            "rate 0 is taken as 1 Hz, never a division by 0"
        );
        let comments: Vec<&str> = p.comment.iter().map(|c| string(&p, *c)).collect();
        assert!(comments[0].starts_with("pyebpf "), "{comments:?}");
        assert!(
            comments.contains(&"command line: pyebpf record -a"),
            "{comments:?}"
        );
        // Absurd metadata saturates instead of overflowing.
        profile.meta.start_unix_s = u64::MAX;
        profile.meta.duration_s = f64::NAN;
        let p = build(&profile);
        assert_eq!((p.time_nanos, p.duration_nanos), (i64::MAX, 0));
    }

    #[test]
    fn decode_rejects_garbage() {
        let bytes = render(&demo_profile());
        assert!(decode(&bytes[..bytes.len() / 2]).is_err(), "truncated gzip");
        assert!(decode(&[0x1f, 0x8b, 0, 0]).is_err());
        assert!(decode(&[0xff; 16]).is_err());
    }
}
