//! The protobuf messages of the saved profile, hand-written for prost (no `protoc`).
//!
//! Owns: the wire schema of format versions 1 to 3 (version 1: one `SavedProfile` with
//! everything; versions 2 and 3: one per chunk, each with the fields of its kind, see
//! [`super::ChunkKind`]; version 3 adds the per-sample `state` and `weight` of a wall-clock
//! run, which change what a sample counts for, so that an older reader refuses it). The same schema as `.proto` text (field numbers
//! are the contract; a reader ignores fields it does not know, so adding fields does not need a
//! new format version, changing the meaning of one does):
//!
//! ```proto
//! syntax = "proto3";
//! package pyebpf.saved.v1;
//!
//! message SavedProfile {
//!   string writer = 1;             // "pyebpf"
//!   string writer_version = 2;     // the writer's version, e.g. "0.1.0"
//!   RunMeta meta = 3;
//!   repeated string strings = 4;   // string table: frame names, modules, files, comms, threads
//!   repeated Frame frames = 5;     // FrameId i = frames[i]
//!   repeated Stack stacks = 6;     // StackId i = stacks[i]
//!   Samples samples = 7;
//!   optional uint64 sample_count = 8;  // end chunk (version 2): samples in the file
//! }
//!
//! message RunMeta {
//!   string host = 1;
//!   string kernel = 2;
//!   uint64 start_unix_s = 3;
//!   double duration_s = 4;
//!   uint64 rate_hz = 5;
//!   uint64 cpus = 6;
//!   repeated string command_line = 7;
//!   uint64 lost_samples = 8;
//!   repeated ErrorCount errors = 9;  // unique kinds
//!   bool idle = 10;                  // a wall-clock run (record --idle)
//! }
//!
//! message ErrorCount {
//!   string kind = 1;
//!   uint64 count = 2;
//! }
//!
//! enum FrameKind {
//!   FRAME_KIND_UNSPECIFIED = 0;  // never written; refused
//!   PROCESS = 1;
//!   THREAD = 2;
//!   PYTHON = 3;
//!   NATIVE = 4;
//!   KERNEL = 5;
//!   MARKER = 6;
//!   STATE = 7;                   // version 3: the thread state ending an off-CPU stack
//! }
//!
//! message Frame {
//!   FrameKind kind = 1;
//!   uint32 name = 2;             // index into strings
//!   optional uint32 module = 3;  // index into strings
//!   optional uint32 file = 4;    // index into strings
//!   optional uint32 line = 5;
//!   optional uint32 short_file = 6;  // index into strings: `file` relative to its sys.path entry
//! }
//!
//! message Stack {
//!   repeated uint32 frames = 1;  // frame indices, root first
//! }
//!
//! enum GilState {
//!   UNKNOWN = 0;
//!   HELD = 1;
//!   RELEASED = 2;
//!   DISABLED = 3;
//! }
//!
//! // One column per sample field, all of the same length (the number of samples), in
//! // arrival order.
//! message Samples {
//!   repeated sint64 time_delta_ns = 1;  // time_ns minus the previous sample's (wrapping; first: minus 0)
//!   repeated uint32 cpu = 2;
//!   repeated uint32 pid = 3;
//!   repeated uint32 tid = 4;
//!   repeated uint32 comm = 5;           // index into strings
//!   repeated uint32 thread_name = 6;    // index into strings
//!   repeated GilState gil = 7;
//!   repeated uint32 stack = 8;          // index into stacks
//!   repeated ThreadState state = 9;     // version 3; empty: all ON_CPU
//!   repeated uint32 weight = 10;        // version 3; empty: all 1
//! }
//!
//! enum ThreadState {
//!   ON_CPU = 0;
//!   RUNNABLE = 1;
//!   SLEEPING = 2;
//!   BLOCKED = 3;
//!   GIL_WAIT = 4;
//! }
//! ```

/// The whole file's message.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SavedProfile {
    /// Program that wrote the file (`pyebpf`).
    #[prost(string, tag = "1")]
    pub writer: String,
    /// Its version.
    #[prost(string, tag = "2")]
    pub writer_version: String,
    /// Run metadata.
    #[prost(message, optional, tag = "3")]
    pub meta: Option<RunMeta>,
    /// String table.
    #[prost(string, repeated, tag = "4")]
    pub strings: Vec<String>,
    /// Interned frames.
    #[prost(message, repeated, tag = "5")]
    pub frames: Vec<Frame>,
    /// Interned stacks.
    #[prost(message, repeated, tag = "6")]
    pub stacks: Vec<Stack>,
    /// Samples, column-wise.
    #[prost(message, optional, tag = "7")]
    pub samples: Option<Samples>,
    /// End chunk: the number of samples in the file.
    #[prost(uint64, optional, tag = "8")]
    pub sample_count: Option<u64>,
}

/// Run metadata.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RunMeta {
    /// Host name.
    #[prost(string, tag = "1")]
    pub host: String,
    /// Kernel release.
    #[prost(string, tag = "2")]
    pub kernel: String,
    /// Wall-clock start (Unix seconds).
    #[prost(uint64, tag = "3")]
    pub start_unix_s: u64,
    /// Sampling duration (s).
    #[prost(double, tag = "4")]
    pub duration_s: f64,
    /// Rate per CPU (Hz).
    #[prost(uint64, tag = "5")]
    pub rate_hz: u64,
    /// CPUs sampled.
    #[prost(uint64, tag = "6")]
    pub cpus: u64,
    /// The profiler's command line.
    #[prost(string, repeated, tag = "7")]
    pub command_line: Vec<String>,
    /// Samples lost.
    #[prost(uint64, tag = "8")]
    pub lost_samples: u64,
    /// Errors by kind.
    #[prost(message, repeated, tag = "9")]
    pub errors: Vec<ErrorCount>,
    /// A wall-clock run (`record --idle`).
    #[prost(bool, tag = "10")]
    pub idle: bool,
}

/// One error kind and its count.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ErrorCount {
    /// Kind.
    #[prost(string, tag = "1")]
    pub kind: String,
    /// Count.
    #[prost(uint64, tag = "2")]
    pub count: u64,
}

/// Frame kinds on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum FrameKind {
    /// Never written.
    Unspecified = 0,
    /// `comm (pid)`.
    Process = 1,
    /// `name (tid)`.
    Thread = 2,
    /// Python function.
    Python = 3,
    /// Native function.
    Native = 4,
    /// Kernel function.
    Kernel = 5,
    /// Marker.
    Marker = 6,
    /// Thread state (version 3).
    State = 7,
}

/// One interned frame.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Frame {
    /// Kind.
    #[prost(enumeration = "FrameKind", tag = "1")]
    pub kind: i32,
    /// Name (string index).
    #[prost(uint32, tag = "2")]
    pub name: u32,
    /// Module (string index).
    #[prost(uint32, optional, tag = "3")]
    pub module: Option<u32>,
    /// File (string index).
    #[prost(uint32, optional, tag = "4")]
    pub file: Option<u32>,
    /// Line.
    #[prost(uint32, optional, tag = "5")]
    pub line: Option<u32>,
    /// Short file name (string index).
    #[prost(uint32, optional, tag = "6")]
    pub short_file: Option<u32>,
}

/// One interned stack.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Stack {
    /// Frame indices, root first.
    #[prost(uint32, repeated, tag = "1")]
    pub frames: Vec<u32>,
}

/// GIL states on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum GilState {
    /// Unknown.
    Unknown = 0,
    /// Held.
    Held = 1,
    /// Released.
    Released = 2,
    /// Disabled.
    Disabled = 3,
}

/// Samples, one column per field.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Samples {
    /// Time minus the previous sample's time (wrapping), ns.
    #[prost(sint64, repeated, tag = "1")]
    pub time_delta_ns: Vec<i64>,
    /// CPU.
    #[prost(uint32, repeated, tag = "2")]
    pub cpu: Vec<u32>,
    /// Process id.
    #[prost(uint32, repeated, tag = "3")]
    pub pid: Vec<u32>,
    /// Thread id.
    #[prost(uint32, repeated, tag = "4")]
    pub tid: Vec<u32>,
    /// comm (string index).
    #[prost(uint32, repeated, tag = "5")]
    pub comm: Vec<u32>,
    /// Thread name (string index).
    #[prost(uint32, repeated, tag = "6")]
    pub thread_name: Vec<u32>,
    /// GIL state.
    #[prost(enumeration = "GilState", repeated, tag = "7")]
    pub gil: Vec<i32>,
    /// Stack (index).
    #[prost(uint32, repeated, tag = "8")]
    pub stack: Vec<u32>,
    /// Thread state (version 3; empty: every sample on a CPU).
    #[prost(enumeration = "ThreadState", repeated, tag = "9")]
    pub state: Vec<i32>,
    /// Weight (version 3; empty: every sample weighs 1).
    #[prost(uint32, repeated, tag = "10")]
    pub weight: Vec<u32>,
}

/// Thread states on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum ThreadState {
    /// On a CPU.
    OnCpu = 0,
    /// Runnable.
    Runnable = 1,
    /// Sleeping.
    Sleeping = 2,
    /// Blocked.
    Blocked = 3,
    /// Waiting for the GIL.
    GilWait = 4,
}
