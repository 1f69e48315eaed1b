//! Which variant of the sampling program this kernel runs (issue 11): the variants and what
//! each needs, as data ([`SAMPLER`]); the kernel's features, probed once per start
//! ([`KernelFeatures::probe`]); the choice ([`choose`]), reported by `record`'s summary.
//!
//! Owns: program selection and kernel probing (the loader in `mod.rs` only loads what this
//! module chose). Input: the running kernel (helper and map-type probes through aya, its BTF),
//! and an optional forced variant (`PYEBPF_SAMPLE_VARIANT=bpf_loop|bounded`, for tests and
//! diagnosis). Output: a [`Choice`], or [`CollectError::KernelFeatures`] naming every missing
//! feature in one line.
//!
//! Constraints: a probe loads a two-instruction program per helper (aya's
//! `is_helper_supported`, libbpf's method), a few milliseconds in all. The off-CPU
//! `sched_switch` program of `--idle` ([`SWITCH`]) has its own table and is chosen and reported
//! the same way. The kernel facts behind each feature: docs/kernels.md.
use std::fmt;

use aya::{
    maps::MapType,
    programs::ProgramType,
    sys::{BpfHelper, is_helper_supported, is_map_supported},
};
use sampler_common::programs;

use super::{btf, error::CollectError};

/// Environment variable forcing a variant by name (tests, diagnosis).
pub const FORCE_ENV: &str = "PYEBPF_SAMPLE_VARIANT";

/// A kernel capability a program needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feature {
    /// The BPF ring buffer map (Linux 5.8).
    RingBuf,
    /// `bpf_probe_read_user` / `bpf_probe_read_kernel` (5.5).
    ProbeRead,
    /// `bpf_get_ns_current_pid_tgid` (5.7): targets in their own pid namespace.
    NsPidTgid,
    /// `bpf_loop` (5.17).
    BpfLoop,
    /// `bpf_get_current_task_btf` (5.11) + `bpf_task_pt_regs` (5.15), which need kernel BTF.
    TaskPtRegs,
    /// Kernel BTF with `task_struct`'s `pid` and state word: BTF tracepoints (5.5) and the
    /// fields the off-CPU programs read.
    KernelBtf,
}

impl Feature {
    /// What it is and the Linux version that brought it, for messages.
    pub fn describe(self) -> &'static str {
        match self {
            Feature::RingBuf => "the BPF ring buffer (Linux 5.8)",
            Feature::ProbeRead => "bpf_probe_read_user (Linux 5.5)",
            Feature::NsPidTgid => "bpf_get_ns_current_pid_tgid (Linux 5.7)",
            Feature::BpfLoop => "bpf_loop (Linux 5.17)",
            Feature::TaskPtRegs => "bpf_task_pt_regs with kernel BTF (Linux 5.15)",
            Feature::KernelBtf => {
                "kernel BTF (/sys/kernel/btf/vmlinux, CONFIG_DEBUG_INFO_BTF) for BTF tracepoints"
            }
        }
    }
}

/// One variant of a program: the program's name in the object and what it needs beyond the
/// program's common needs.
#[derive(Debug, PartialEq, Eq)]
pub struct Variant {
    /// Program name in the eBPF object (`sampler_common::programs`).
    pub program: &'static str,
    /// Short name, shown in the summary and accepted by [`FORCE_ENV`].
    pub name: &'static str,
    /// Features this variant needs on top of [`Program::needs`].
    pub needs: &'static [Feature],
    /// Whether it reads the saved user registers through `task->stack` (needs the BTF offset).
    pub task_stack: bool,
}

/// A program and its variants, best first.
#[derive(Debug)]
pub struct Program {
    /// What the program does, for messages.
    pub role: &'static str,
    /// Needed by every variant.
    pub needs: &'static [Feature],
    /// Best first: the first whose needs are met is loaded.
    pub variants: &'static [Variant],
}

/// The CPU-clock sampler (`sampler-ebpf/src/variant.rs` has the two drivers).
pub const SAMPLER: Program = Program {
    role: "sampling program",
    needs: &[Feature::RingBuf, Feature::ProbeRead, Feature::NsPidTgid],
    variants: &[
        Variant {
            program: programs::SAMPLE,
            name: "bpf_loop",
            needs: &[Feature::BpfLoop, Feature::TaskPtRegs],
            task_stack: false,
        },
        Variant {
            program: programs::SAMPLE_BOUNDED,
            name: "bounded",
            needs: &[],
            task_stack: true,
        },
    ],
};

/// The off-CPU `sched_switch` program of `--idle` (`sampler-ebpf/src/offcpu.rs`), in the same
/// two variants as [`SAMPLER`] (it runs the same Python walk); `pyebpf_wakeup` goes with
/// either.
pub const SWITCH: Program = Program {
    role: "off-CPU program (--idle)",
    needs: &[
        Feature::RingBuf,
        Feature::ProbeRead,
        Feature::NsPidTgid,
        Feature::KernelBtf,
    ],
    variants: &[
        Variant {
            program: programs::SWITCH,
            name: "bpf_loop",
            needs: &[Feature::BpfLoop, Feature::TaskPtRegs],
            task_stack: false,
        },
        Variant {
            program: programs::SWITCH_BOUNDED,
            name: "bounded",
            needs: &[],
            task_stack: true,
        },
    ],
};

/// The program that follows children of targets (`-s`, `-- COMMAND`): the `task_newtask` raw
/// tracepoint where the kernel BTF gives `task_struct.pid`, else the perf-event tracepoint
/// (whose detach waits for RCU grace periods: about 100 ms more at the end of a run).
pub const FOLLOW: Program = Program {
    role: "child-following program",
    needs: &[Feature::RingBuf, Feature::ProbeRead],
    variants: &[
        Variant {
            program: programs::FORK,
            name: "raw_tracepoint",
            needs: &[Feature::KernelBtf],
            task_stack: false,
        },
        Variant {
            program: programs::FORK_TRACEPOINT,
            name: "tracepoint",
            needs: &[],
            task_stack: false,
        },
    ],
};

/// How the variant is picked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum VariantChoice {
    /// The best the kernel supports.
    #[default]
    Auto,
    /// This one by name (an error if the kernel lacks what it needs).
    Named(String),
}

impl VariantChoice {
    /// [`FORCE_ENV`] if set and not empty, else [`VariantChoice::Auto`].
    pub fn from_env() -> VariantChoice {
        match std::env::var(FORCE_ENV) {
            Ok(name) if !name.is_empty() => VariantChoice::Named(name),
            _ => VariantChoice::Auto,
        }
    }
}

/// The chosen variant and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// The variant to load.
    pub variant: &'static Variant,
    /// Why not a better one: the features the better variants miss (empty when the best was
    /// chosen), or that it was forced.
    pub reason: String,
}

impl fmt::Display for Choice {
    /// `bounded (no bpf_loop (Linux 5.17))`, or just `bpf_loop`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.variant.name)?;
        if !self.reason.is_empty() {
            write!(f, " ({})", self.reason)?;
        }
        Ok(())
    }
}

/// What the kernel offers, as far as the programs care.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelFeatures {
    /// Features found.
    pub present: Vec<Feature>,
    /// `task_struct.stack`'s byte offset from the kernel BTF, if BTF is there.
    pub task_stack_offset: Option<u32>,
    /// `task_struct.pid`'s byte offset.
    pub task_pid_offset: Option<u32>,
    /// The byte offset of `task_struct`'s state word (`__state` from 5.14, `state` before).
    pub task_state_offset: Option<u32>,
    /// `sched_switch` passes `prev_state` (5.18+: its BTF prototype has 5 parameters with
    /// the tracepoint's `__data`).
    pub switch_prev_state: bool,
    /// `task_struct.thread.fsbase`'s byte offset (the ≤ 3.10 Python thread match).
    pub task_fsbase_offset: Option<u32>,
}

impl KernelFeatures {
    /// Probe the running kernel. `btf_path` is the kernel BTF to read ([`btf::path`]:
    /// end-to-end tests fake a missing one): read once here for every offset the run needs,
    /// and dropped on return.
    pub fn probe(btf_path: &std::path::Path) -> KernelFeatures {
        let perf = ProgramType::PerfEvent;
        let helper = |h: BpfHelper| {
            is_helper_supported(perf, h).unwrap_or_else(|e| {
                tracing::debug!("probing helper {h:?}: {e}");
                false
            })
        };
        let btf = std::fs::read(btf_path).ok();
        let mut present = Vec::new();
        let mut found = |feature, yes: bool| {
            if yes {
                present.push(feature);
            }
        };
        found(
            Feature::RingBuf,
            is_map_supported(MapType::RingBuf).unwrap_or(false),
        );
        found(
            Feature::ProbeRead,
            helper(BpfHelper::BPF_FUNC_probe_read_user)
                && helper(BpfHelper::BPF_FUNC_probe_read_kernel),
        );
        found(
            Feature::NsPidTgid,
            helper(BpfHelper::BPF_FUNC_get_ns_current_pid_tgid),
        );
        found(Feature::BpfLoop, helper(BpfHelper::BPF_FUNC_loop));
        found(
            Feature::TaskPtRegs,
            btf.is_some()
                && helper(BpfHelper::BPF_FUNC_get_current_task_btf)
                && helper(BpfHelper::BPF_FUNC_task_pt_regs),
        );
        let types = btf.as_deref().and_then(btf::Types::parse);
        let member = |path: &[&str]| {
            types
                .as_ref()
                .and_then(|t| t.member_offset("task_struct", path))
        };
        let task_pid_offset = member(&["pid"]);
        let task_state_offset = member(&["__state"]).or_else(|| member(&["state"]));
        found(
            Feature::KernelBtf,
            task_pid_offset.is_some() && task_state_offset.is_some(),
        );
        KernelFeatures {
            present,
            task_stack_offset: member(&["stack"]),
            task_pid_offset,
            task_state_offset,
            switch_prev_state: types
                .as_ref()
                .and_then(|t| t.typedef_fn_params("btf_trace_sched_switch"))
                .is_some_and(|n| n >= 5),
            task_fsbase_offset: member(&["thread", "fsbase"]),
        }
    }

    /// Whether the kernel has `feature`.
    pub fn has(&self, feature: Feature) -> bool {
        self.present.contains(&feature)
    }
}

/// The variant of `program` to load on a kernel with `features`.
pub fn choose(
    program: &'static Program,
    features: &KernelFeatures,
    choice: &VariantChoice,
) -> Result<Choice, CollectError> {
    let missing = |needs: &[Feature]| -> Vec<Feature> {
        needs
            .iter()
            .copied()
            .filter(|&f| !features.has(f))
            .collect()
    };
    let unsupported = |what: String, lacking: &[Feature]| CollectError::KernelFeatures {
        what,
        missing: lacking
            .iter()
            .map(|f| f.describe())
            .collect::<Vec<_>>()
            .join(", "),
    };
    let common = missing(program.needs);
    if !common.is_empty() {
        return Err(unsupported(format!("the {}", program.role), &common));
    }
    if let VariantChoice::Named(name) = choice {
        let Some(variant) = program.variants.iter().find(|v| v.name == name) else {
            return Err(CollectError::InvalidConfig {
                setting: FORCE_ENV,
                reason: format!(
                    "no variant '{name}' of the {}: use one of {}",
                    program.role,
                    program
                        .variants
                        .iter()
                        .map(|v| v.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        };
        let lacking = missing(variant.needs);
        if !lacking.is_empty() {
            return Err(unsupported(
                format!("the {} variant {name} ({FORCE_ENV})", program.role),
                &lacking,
            ));
        }
        return Ok(Choice {
            variant,
            reason: format!("forced by {FORCE_ENV}"),
        });
    }
    let mut skipped: Vec<Feature> = Vec::new();
    for variant in program.variants {
        let lacking = missing(variant.needs);
        if lacking.is_empty() {
            let reason = if skipped.is_empty() {
                String::new()
            } else {
                format!(
                    "this kernel lacks {}",
                    skipped
                        .iter()
                        .map(|f| f.describe())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            return Ok(Choice { variant, reason });
        }
        for f in lacking {
            if !skipped.contains(&f) {
                skipped.push(f);
            }
        }
    }
    Err(unsupported(format!("the {}", program.role), &skipped))
}

/// The line printed before sampling when a run loses something on this kernel: a variant
/// reading `task->stack` without the offset cannot find the user registers of samples taken
/// in kernel mode, which only matters when user stacks are copied (`--native`).
pub fn degraded_note(
    choice: &Choice,
    features: &KernelFeatures,
    stack_bytes: u32,
) -> Option<String> {
    (choice.variant.task_stack && features.task_stack_offset.is_none() && stack_bytes > 0).then(
        || {
            "kernel BTF is missing, so samples taken in kernel mode have no user registers: their \
             native stacks are empty (Python frames are unaffected)"
                .to_string()
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(present: &[Feature], offset: Option<u32>) -> KernelFeatures {
        KernelFeatures {
            present: present.to_vec(),
            task_stack_offset: offset,
            ..KernelFeatures::default()
        }
    }

    const BASE: [Feature; 3] = [Feature::RingBuf, Feature::ProbeRead, Feature::NsPidTgid];

    fn with(extra: &[Feature]) -> Vec<Feature> {
        BASE.iter().chain(extra).copied().collect()
    }

    #[test]
    fn newest_kernels_get_bpf_loop() {
        let k = kernel(&with(&[Feature::BpfLoop, Feature::TaskPtRegs]), Some(32));
        let c = choose(&SAMPLER, &k, &VariantChoice::Auto).unwrap();
        assert_eq!(c.variant.program, programs::SAMPLE);
        assert_eq!(c.to_string(), "bpf_loop");
        assert_eq!(degraded_note(&c, &k, 32 << 10), None);
    }

    #[test]
    fn kernels_without_bpf_loop_get_bounded_and_say_why() {
        // 5.10: no bpf_loop, no bpf_task_pt_regs.
        let k = kernel(&with(&[]), Some(24));
        let c = choose(&SAMPLER, &k, &VariantChoice::Auto).unwrap();
        assert_eq!(c.variant.program, programs::SAMPLE_BOUNDED);
        assert_eq!(
            c.to_string(),
            "bounded (this kernel lacks bpf_loop (Linux 5.17), bpf_task_pt_regs with kernel BTF \
             (Linux 5.15))"
        );
        assert_eq!(degraded_note(&c, &k, 32 << 10), None);
        // 5.15: bpf_task_pt_regs but no bpf_loop.
        let k = kernel(&with(&[Feature::TaskPtRegs]), Some(24));
        let c = choose(&SAMPLER, &k, &VariantChoice::Auto).unwrap();
        assert_eq!(c.variant.name, "bounded");
        assert_eq!(c.reason, "this kernel lacks bpf_loop (Linux 5.17)");
    }

    #[test]
    fn no_btf_runs_bounded_with_one_note_only_for_native() {
        let k = kernel(&with(&[Feature::BpfLoop]), None);
        let c = choose(&SAMPLER, &k, &VariantChoice::Auto).unwrap();
        assert_eq!(c.variant.name, "bounded");
        let note = degraded_note(&c, &k, 8 << 10).expect("a note with --native");
        assert!(note.contains("BTF") && !note.contains('\n'), "{note}");
        assert_eq!(degraded_note(&c, &k, 0), None);
    }

    #[test]
    fn missing_common_features_are_named_in_one_line() {
        let k = kernel(&[Feature::ProbeRead], None);
        let err = choose(&SAMPLER, &k, &VariantChoice::Auto).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("the BPF ring buffer (Linux 5.8)")
                && msg.contains("bpf_get_ns_current_pid_tgid (Linux 5.7)")
                && !msg.contains("bpf_loop")
                && !msg.contains('\n'),
            "{msg}"
        );
    }

    #[test]
    fn forced_variants() {
        let old = kernel(&with(&[]), Some(24));
        let forced = |name: &str, k: &KernelFeatures| {
            choose(&SAMPLER, k, &VariantChoice::Named(name.to_string()))
        };
        let c = forced("bounded", &old).unwrap();
        assert_eq!(c.to_string(), "bounded (forced by PYEBPF_SAMPLE_VARIANT)");
        let err = forced("bpf_loop", &old).unwrap_err().to_string();
        assert!(err.contains("bpf_loop (Linux 5.17)"), "{err}");
        let err = forced("tail_calls", &old).unwrap_err().to_string();
        assert!(err.contains("bpf_loop, bounded"), "{err}");
        let new = kernel(&with(&[Feature::BpfLoop, Feature::TaskPtRegs]), Some(24));
        assert_eq!(forced("bounded", &new).unwrap().variant.name, "bounded");
    }

    #[test]
    fn every_variant_names_a_distinct_program() {
        let names: Vec<&str> = SAMPLER.variants.iter().map(|v| v.program).collect();
        assert_eq!(names, [programs::SAMPLE, programs::SAMPLE_BOUNDED]);
        // The last variant needs nothing beyond the common needs: a kernel with those always
        // gets a variant.
        assert!(SAMPLER.variants.last().unwrap().needs.is_empty());
    }
}
