//! merge stage: one mixed stack from a native stack and the Python frames captured at the same
//! instant (issue 4, `record --native`).
//!
//! Owns: the merge rule and the eval-loop address ranges it needs ([`evalrange`]: found per
//! build, kept per process by [`EvalLoops`]).
//! Input: the native frames (innermost first) with their role — eval-loop frame or not — and
//! the captured Python frames (innermost first) with the entry frames kept as delimiters.
//! Output: the mixed stack, root first, and a [`MergeOutcome`].
//!
//! The rule. Every activation of `_PyEval_EvalFrameDefault` pushes one entry frame (owner ≥ 3,
//! docs/cpython-layouts.md §3.4) below the frames it runs, so the captured chain splits at entry frames
//! into groups, one per activation, the entry frame being the bottom of its group. The native
//! stack has one eval-loop frame per activation (the `.cold` parts run on the same frame; a
//! `.part`/`.isra`/`.constprop` clone that the main symbol *calls* is a second native frame of
//! the same activation: it is folded into its caller, see [`Role::EvalClone`]). With as many
//! eval-loop frames as groups, the k-th eval-loop frame from the innermost is replaced by the
//! k-th group. One activation more than groups, with a complete capture, is an activation caught
//! entering or leaving: between `_PyEval_EvalFrameDefault`'s first instruction and the linking of
//! its entry frame (or after the unlinking), the innermost activation has no frames yet — it can
//! only be the innermost, the outer ones are suspended in calls — so it stays a native frame and
//! the others are merged as usual. Otherwise the sample is kept unmerged — native frames, a
//! marker, then the Python frames — and reported as a mismatch: never dropped, never guessed.
//! Constraints: pure (no I/O), generic over the frame type, allocation-free except `out`.

pub mod ehframe;
pub mod evalrange;

pub use evalrange::{EvalLoops, EvalRange, EvalRangeIssue, EvalRanges, FileEvalRanges};

/// One captured Python frame, innermost first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PyItem<T> {
    /// A Python frame (resolved, or an "unknown" placeholder).
    Frame(T),
    /// An entry frame (owner ≥ 3): the bottom of one eval-loop activation's frames.
    Entry,
}

/// What a native frame is to the merge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Any native function.
    Other,
    /// `_PyEval_EvalFrameDefault` or a part of it that runs on its frame (`.cold`).
    Eval,
    /// A separately called clone of the eval loop (`.part.N`, …): one activation with the
    /// eval-loop frame that calls it, when that caller is its immediate parent.
    EvalClone,
}

/// One native frame, innermost first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NativeItem<T> {
    /// The symbolized frame.
    pub frame: T,
    /// Its role.
    pub role: Role,
}

/// How a merge went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MergeOutcome {
    /// Neither eval-loop frames nor Python frames: the native stack as is.
    NativeOnly,
    /// Every eval-loop activation was replaced by its Python frames.
    Merged {
        /// Number of activations.
        activations: usize,
    },
    /// The counts differ: native frames, the marker, then the Python frames.
    Mismatch {
        /// Eval-loop activations in the native stack.
        eval_activations: usize,
        /// Groups of Python frames (entry-delimited; a trailing group without its entry frame
        /// counts too).
        python_groups: usize,
    },
}

/// Whether native frame `i` starts an activation (`Eval`, or a clone whose caller is not
/// eval-loop code) or continues the one of its caller (a clone called by the eval loop).
fn activation_at<T>(native: &[NativeItem<T>], i: usize) -> Option<bool> {
    match native[i].role {
        Role::Other => None,
        Role::Eval => Some(true),
        Role::EvalClone => {
            let caller_is_eval = native.get(i + 1).is_some_and(|n| n.role != Role::Other);
            Some(!caller_is_eval)
        }
    }
}

/// Number of eval-loop activations in `native`.
pub fn eval_activations<T>(native: &[NativeItem<T>]) -> usize {
    (0..native.len())
        .filter(|&i| activation_at(native, i) == Some(true))
        .count()
}

/// Number of Python frame groups in `py`: entry frames, plus one for frames after the last
/// entry frame (a capture cut before its outermost entry frame).
pub fn python_groups<T>(py: &[PyItem<T>]) -> usize {
    let entries = py.iter().filter(|i| matches!(i, PyItem::Entry)).count();
    let trailing = py
        .iter()
        .rev()
        .take_while(|i| matches!(i, PyItem::Frame(_)))
        .count()
        > 0;
    entries + usize::from(trailing)
}

/// Appends the Python frames of `py` to `out`, outermost first (entry frames skipped): the
/// default, Python-only stack.
pub fn python_only<T: Copy>(py: &[PyItem<T>], out: &mut Vec<T>) {
    out.extend(py.iter().rev().filter_map(|i| match i {
        PyItem::Frame(f) => Some(*f),
        PyItem::Entry => None,
    }));
}

/// Merges `native` and `py` (both innermost first) and appends the result to `out`, root
/// first. `mismatch_marker` separates the two halves of an unmergeable sample. `py_complete`:
/// the capture reached the outermost frame (not truncated), so a missing group can only be the
/// innermost activation's (see the module header).
pub fn merge<T: Copy>(
    native: &[NativeItem<T>],
    py: &[PyItem<T>],
    py_complete: bool,
    mismatch_marker: T,
    out: &mut Vec<T>,
) -> MergeOutcome {
    let activations = eval_activations(native);
    let groups = python_groups(py);
    if activations == 0 && groups == 0 {
        out.extend(native.iter().rev().map(|n| n.frame));
        return MergeOutcome::NativeOnly;
    }
    // The innermost activation caught entering or leaving: kept as its native frame(s).
    // (At least one group: no frames at all is a thread state not found, not an entry.)
    let entering = py_complete && groups > 0 && activations == groups + 1;
    if activations != groups && !entering {
        out.extend(native.iter().rev().map(|n| n.frame));
        out.push(mismatch_marker);
        python_only(py, out);
        return MergeOutcome::Mismatch {
            eval_activations: activations,
            python_groups: groups,
        };
    }
    // Walk both from the root: the outermost activation owns the outermost group. `end` is
    // the exclusive end (in `py`, innermost-first indices) of the group still to place.
    let mut end = py.len();
    // Native index of the innermost activation's start when it has no group.
    let frameless = if entering {
        (0..native.len()).find(|&i| activation_at(native, i) == Some(true))
    } else {
        None
    };
    for i in (0..native.len()).rev() {
        match activation_at(native, i) {
            None => out.push(native[i].frame),
            // The frameless activation, and clones folded into it, stay native frames.
            _ if frameless.is_some_and(|f| i <= f) => out.push(native[i].frame),
            Some(false) => {} // a clone folded into its caller's activation
            Some(true) => {
                // The group is py[start..end]: everything after the previous entry frame,
                // up to and including this activation's entry frame (if captured).
                let bottom = if matches!(py.get(end.wrapping_sub(1)), Some(PyItem::Entry)) {
                    end - 1
                } else {
                    end // the trailing group of a cut capture has no entry frame
                };
                let start = py[..bottom]
                    .iter()
                    .rposition(|i| matches!(i, PyItem::Entry))
                    .map_or(0, |p| p + 1);
                out.extend(py[start..bottom].iter().rev().filter_map(|i| match i {
                    PyItem::Frame(f) => Some(*f),
                    PyItem::Entry => None,
                }));
                end = start;
            }
        }
    }
    MergeOutcome::Merged {
        activations: activations - usize::from(frameless.is_some()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MARK: &str = "[merge mismatch]";

    fn native<'a>(frames: &[&'a str]) -> Vec<NativeItem<&'a str>> {
        frames
            .iter()
            .map(|&f| NativeItem {
                frame: f,
                role: if f.starts_with("eval.clone") {
                    Role::EvalClone
                } else if f.starts_with("eval") {
                    Role::Eval
                } else {
                    Role::Other
                },
            })
            .collect()
    }

    /// `"|"` is an entry frame.
    fn py<'a>(frames: &[&'a str]) -> Vec<PyItem<&'a str>> {
        frames
            .iter()
            .map(|&f| {
                if f == "|" {
                    PyItem::Entry
                } else {
                    PyItem::Frame(f)
                }
            })
            .collect()
    }

    fn run(n: &[&'static str], p: &[&'static str]) -> (Vec<&'static str>, MergeOutcome) {
        let mut out = vec!["root"];
        let o = merge(&native(n), &py(p), true, MARK, &mut out);
        (out, o)
    }

    #[test]
    fn innermost_activation_caught_entering_stays_native() {
        // `sorted(key=k)` called the key function: the eval loop for `k` has started but not
        // yet linked its entry frame (a dump's pause landed in its prologue).
        let (out, o) = run(
            &["eval", "call_one_arg", "sort", "eval", "main"],
            &["f", "|"],
        );
        assert_eq!(out, ["root", "main", "f", "sort", "call_one_arg", "eval"]);
        assert_eq!(o, MergeOutcome::Merged { activations: 1 });
        // A clone of the frameless activation stays with it.
        let (out, _) = run(&["eval.clone", "eval", "sort", "eval", "main"], &["f", "|"]);
        assert_eq!(out, ["root", "main", "f", "sort", "eval", "eval.clone"]);
        // A truncated capture may have lost an outer group instead: a mismatch.
        let mut out = vec!["root"];
        let o = merge(
            &native(&["eval", "sort", "eval", "main"]),
            &py(&["k", "|"]),
            false,
            MARK,
            &mut out,
        );
        assert!(matches!(o, MergeOutcome::Mismatch { .. }), "{out:?}");
        // Two activations more than groups: a mismatch.
        let (_, o) = run(&["eval", "x", "eval", "y", "eval", "main"], &["f", "|"]);
        assert!(matches!(o, MergeOutcome::Mismatch { .. }));
    }

    #[test]
    fn one_activation() {
        // python3 → Py_RunMain → … → eval running main() → f() → g(), sampled in g.
        let (out, o) = run(
            &["eval", "PyRun_Main", "main", "_start"],
            &["g", "f", "<module>", "|"],
        );
        assert_eq!(
            out,
            ["root", "_start", "main", "PyRun_Main", "<module>", "f", "g"]
        );
        assert_eq!(o, MergeOutcome::Merged { activations: 1 });
    }

    #[test]
    fn sample_inside_c_called_from_python() {
        // g() called len(), sampled in C: the C frames go on top of the Python frames.
        let (out, o) = run(
            &["memcpy", "list_len", "eval", "main"],
            &["g", "<module>", "|"],
        );
        assert_eq!(out, ["root", "main", "<module>", "g", "list_len", "memcpy"]);
        assert_eq!(o, MergeOutcome::Merged { activations: 1 });
    }

    #[test]
    fn python_c_python_sorted_with_a_key_function() {
        // <module> → outer() → sorted(key=key) → key() → inner(), sampled in inner.
        let (out, o) = run(
            &[
                "eval",
                "vectorcall",
                "list_sort_impl",
                "builtin_sorted",
                "eval",
                "Py_RunMain",
                "main",
            ],
            &["inner", "key", "|", "outer", "<module>", "|"],
        );
        assert_eq!(
            out,
            [
                "root",
                "main",
                "Py_RunMain",
                "<module>",
                "outer",
                "builtin_sorted",
                "list_sort_impl",
                "vectorcall",
                "key",
                "inner"
            ]
        );
        assert_eq!(o, MergeOutcome::Merged { activations: 2 });
    }

    #[test]
    fn cold_part_counts_as_its_activation() {
        // `eval.cold` is classified Eval (same frame): two activations, two groups.
        let (out, o) = run(
            &["eval.cold", "sort", "eval", "main"],
            &["key", "|", "m", "|"],
        );
        assert_eq!(out, ["root", "main", "m", "sort", "key"]);
        assert_eq!(o, MergeOutcome::Merged { activations: 2 });
    }

    #[test]
    fn called_clone_is_folded_into_its_caller() {
        let (out, o) = run(&["eval.clone", "eval", "main"], &["f", "|"]);
        assert_eq!(out, ["root", "main", "f"]);
        assert_eq!(o, MergeOutcome::Merged { activations: 1 });
        // A clone called from C starts its own activation.
        let (out, o) = run(
            &["eval.clone", "sort", "eval", "main"],
            &["k", "|", "f", "|"],
        );
        assert_eq!(out, ["root", "main", "f", "sort", "k"]);
        assert_eq!(o, MergeOutcome::Merged { activations: 2 });
    }

    #[test]
    fn counts_that_differ_are_a_mismatch_with_the_marker() {
        // The native unwind stopped before the outer eval loop: 1 activation, 2 groups.
        let (out, o) = run(&["eval", "vectorcall", "sort"], &["key", "|", "f", "|"]);
        assert_eq!(
            out,
            ["root", "sort", "vectorcall", "eval", MARK, "f", "key"]
        );
        assert_eq!(
            o,
            MergeOutcome::Mismatch {
                eval_activations: 1,
                python_groups: 2
            }
        );
        // Eval-loop frames but no Python frames (thread state not found).
        let (out, o) = run(&["eval", "main"], &[]);
        assert_eq!(out, ["root", "main", "eval", MARK]);
        assert_eq!(
            o,
            MergeOutcome::Mismatch {
                eval_activations: 1,
                python_groups: 0
            }
        );
    }

    #[test]
    fn no_python_is_native_only() {
        let (out, o) = run(&["epoll_wait", "worker", "start_thread"], &[]);
        assert_eq!(out, ["root", "start_thread", "worker", "epoll_wait"]);
        assert_eq!(o, MergeOutcome::NativeOnly);
    }

    #[test]
    fn cut_capture_keeps_its_trailing_group() {
        // Frames after the last entry frame form the outermost group.
        let (out, o) = run(&["eval", "sort", "eval", "main"], &["k", "|", "f", "g"]);
        assert_eq!(out, ["root", "main", "g", "f", "sort", "k"]);
        assert_eq!(o, MergeOutcome::Merged { activations: 2 });
        assert_eq!(python_groups(&py(&["k", "|", "f", "g"])), 2);
        assert_eq!(python_groups(&py(&["k", "|"])), 1);
        assert_eq!(python_groups::<&str>(&[]), 0);
    }

    #[test]
    fn empty_group_replaces_its_activation_with_nothing() {
        let (out, o) = run(&["eval", "sort", "eval", "main"], &["|", "f", "|"]);
        assert_eq!(out, ["root", "main", "f", "sort"]);
        assert_eq!(o, MergeOutcome::Merged { activations: 2 });
    }

    #[test]
    fn python_only_is_outermost_first_without_entries() {
        let mut out = Vec::new();
        python_only(&py(&["inner", "key", "|", "outer", "|"]), &mut out);
        assert_eq!(out, ["outer", "key", "inner"]);
    }
}
