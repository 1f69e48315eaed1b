//! speedscope JSON: one "sampled" profile per process, frames shared, rendered from the
//! profile's counts: one sample per distinct stack of the process, weighted by its time
//! (samples × the sampling period), in the order the stacks were first seen — the form py-spy
//! writes. speedscope's "Left Heavy" and "Sandwich" views show exactly what the flame graph
//! shows; its "Time Order" view is the first-seen order, not a timeline (pyebpf keeps no
//! per-sample timeline in memory: the saved `.pyebpf` file has it, `pyebpf script` prints it).
//! Schema: <https://www.speedscope.app/file-format-schema.json>.
//!
//! Streamed: the document is written as it is walked (strings through `serde_json`), never
//! built as a tree.

use std::collections::BTreeMap;
use std::io::{self, Write};

use super::Renderer;
use crate::lru::FastMap;
use crate::profile::{FrameKind, Profile, StackId};

/// speedscope renderer.
pub struct Speedscope;

/// A JSON string.
fn string(out: &mut dyn Write, s: &str) -> io::Result<()> {
    serde_json::to_writer(&mut *out, s).map_err(io::Error::other)
}

impl Renderer for Speedscope {
    fn render(&self, profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
        out.write_all(
            br#"{"$schema":"https://www.speedscope.app/file-format-schema.json","shared":{"frames":["#,
        )?;
        for (i, f) in profile.frames().iter().enumerate() {
            out.write_all(if i == 0 {
                b"{\"name\":"
            } else {
                b",{\"name\":"
            })?;
            string(out, &f.label_as(profile.file_names))?;
            let file = match f.kind {
                crate::profile::FrameKind::Python => f.display_file(profile.file_names),
                _ => f.file.as_deref(),
            };
            if let Some(file) = file.or(f.module.as_deref()) {
                out.write_all(b",\"file\":")?;
                string(out, file)?;
            }
            if let Some(line) = f.line {
                write!(out, ",\"line\":{line}")?;
            }
            out.write_all(b"}")?;
        }
        out.write_all(b"]},\"profiles\":[")?;
        // The counts by process: one weighted sample per distinct stack (of any thread), in
        // first-seen order.
        let mut by_pid: BTreeMap<u32, Vec<(StackId, u64)>> = BTreeMap::new();
        let mut at: FastMap<(u32, StackId), usize> = FastMap::default();
        for (k, c) in profile.counts() {
            let stacks = by_pid.entry(k.pid).or_default();
            let i = *at.entry((k.pid, k.stack)).or_insert_with(|| {
                stacks.push((k.stack, 0));
                stacks.len() - 1
            });
            stacks[i].1 += c.weight;
        }
        let period_ns = 1_000_000_000 / profile.meta.rate_hz.max(1);
        let root_of = |stack: StackId| {
            let mut stack = profile.stack(stack);
            if stack
                .first()
                .is_some_and(|r| profile.frame(*r).kind == FrameKind::Process)
            {
                let root = stack.remove(0);
                (Some(root), stack)
            } else {
                (None, stack)
            }
        };
        for (n, (pid, stacks)) in by_pid.into_iter().enumerate() {
            let total: u64 = stacks
                .iter()
                .map(|(_, w)| w.saturating_mul(period_ns))
                .sum();
            // The last stack's root frame names the profile (`comm (pid)`).
            let name = stacks
                .iter()
                .rev()
                .find_map(|(s, _)| root_of(*s).0)
                .map_or_else(
                    || format!("pid {pid}"),
                    |r| profile.frame(r).name.to_string(),
                );
            out.write_all(if n == 0 { b"{" } else { b",{" })?;
            out.write_all(br#""type":"sampled","name":"#)?;
            string(out, &name)?;
            write!(
                out,
                r#","unit":"nanoseconds","startValue":0,"endValue":{total},"samples":["#
            )?;
            for (k, (stack, _)) in stacks.iter().enumerate() {
                out.write_all(if k == 0 { b"[" } else { b",[" })?;
                for (j, f) in root_of(*stack).1.iter().enumerate() {
                    if j > 0 {
                        out.write_all(b",")?;
                    }
                    write!(out, "{}", f.0)?;
                }
                out.write_all(b"]")?;
            }
            out.write_all(br#"],"weights":["#)?;
            for (k, (_, weight)) in stacks.iter().enumerate() {
                if k > 0 {
                    out.write_all(b",")?;
                }
                write!(out, "{}", period_ns.saturating_mul(*weight))?;
            }
            out.write_all(b"]}")?;
        }
        write!(
            out,
            r#"],"name":"pyebpf","activeProfileIndex":0,"exporter":"pyebpf {}"}}"#,
            env!("CARGO_PKG_VERSION")
        )?;
        writeln!(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn schema_fields_present_and_indices_valid() {
        let p = crate::output::tests::demo_profile();
        let mut buf = Vec::new();
        Speedscope.render(&p, &mut buf).unwrap();
        let v: Value = serde_json::from_slice(&buf).unwrap();
        assert_eq!(
            v["$schema"],
            "https://www.speedscope.app/file-format-schema.json"
        );
        let nframes = v["shared"]["frames"].as_array().unwrap().len();
        let profiles = v["profiles"].as_array().unwrap();
        assert_eq!(profiles.len(), 2);
        let mut total = 0;
        let period = 1_000_000_000 / p.meta.rate_hz;
        for prof in profiles {
            assert_eq!(prof["type"], "sampled");
            let samples = prof["samples"].as_array().unwrap();
            let weights = prof["weights"].as_array().unwrap();
            assert_eq!(samples.len(), weights.len());
            for s in samples {
                for f in s.as_array().unwrap() {
                    assert!((f.as_u64().unwrap() as usize) < nframes);
                }
            }
            let sum: u64 = weights.iter().map(|w| w.as_u64().unwrap()).sum();
            assert_eq!(prof["endValue"].as_u64().unwrap(), sum);
            total += sum;
        }
        assert_eq!(
            total,
            p.total_weight() * period,
            "every sample's time, once"
        );
        assert_eq!(profiles[0]["name"], "app (10)");
        // One entry per distinct stack: app has two, py one.
        assert_eq!(profiles[0]["samples"].as_array().unwrap().len(), 2);
        assert_eq!(profiles[1]["samples"].as_array().unwrap().len(), 1);
    }
}
