//! speedscope JSON: one "sampled" profile per process, in sample-time order, frames shared.
//! Schema: <https://www.speedscope.app/file-format-schema.json>.
//!
//! Streamed: the document is written as it is walked (strings through `serde_json`), never
//! built as a tree; beyond the profile itself it needs 4 bytes per sample (the per-process
//! order), so writing 262 k samples costs a few MiB, not the gigabytes a `serde_json::Value`
//! tree of every sample's stack took.

use std::collections::BTreeMap;
use std::io::{self, Write};

use super::Renderer;
use crate::profile::{FrameKind, Profile};

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
        // Samples by process, each in time order.
        let samples = profile.samples();
        let mut by_pid: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for (i, s) in samples.iter().enumerate() {
            by_pid.entry(s.pid).or_default().push(i as u32);
        }
        let period_ns = 1_000_000_000 / profile.meta.rate_hz.max(1);
        let root_of = |i: u32| {
            let stack = profile.stack(samples[i as usize].stack);
            match stack.split_first() {
                Some((r, rest)) if profile.frame(*r).kind == FrameKind::Process => (Some(*r), rest),
                _ => (None, stack),
            }
        };
        for (n, (pid, mut idx)) in by_pid.into_iter().enumerate() {
            idx.sort_by_key(|&i| samples[i as usize].time_ns);
            let first = &samples[idx[0] as usize];
            let start = first.time_ns;
            let end = samples[idx[idx.len() - 1] as usize].time_ns + period_ns;
            // The last sample's root frame names the profile (`comm (pid)`).
            let name = idx.iter().rev().find_map(|&i| root_of(i).0).map_or_else(
                || format!("{} ({pid})", first.comm),
                |r| profile.frame(r).name.to_string(),
            );
            out.write_all(if n == 0 { b"{" } else { b",{" })?;
            out.write_all(br#""type":"sampled","name":"#)?;
            string(out, &name)?;
            write!(
                out,
                r#","unit":"nanoseconds","startValue":0,"endValue":{},"samples":["#,
                end - start
            )?;
            for (k, &i) in idx.iter().enumerate() {
                out.write_all(if k == 0 { b"[" } else { b",[" })?;
                for (j, f) in root_of(i).1.iter().enumerate() {
                    if j > 0 {
                        out.write_all(b",")?;
                    }
                    write!(out, "{}", f.0)?;
                }
                out.write_all(b"]")?;
            }
            out.write_all(br#"],"weights":["#)?;
            for (k, &i) in idx.iter().enumerate() {
                if k > 0 {
                    out.write_all(b",")?;
                }
                // An off-CPU sample (`--idle`) stands for `weight` periods.
                let w = period_ns.saturating_mul(u64::from(samples[i as usize].weight));
                write!(out, "{w}")?;
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
        for prof in profiles {
            assert_eq!(prof["type"], "sampled");
            let samples = prof["samples"].as_array().unwrap();
            assert_eq!(samples.len(), prof["weights"].as_array().unwrap().len());
            for s in samples {
                for f in s.as_array().unwrap() {
                    assert!((f.as_u64().unwrap() as usize) < nframes);
                }
            }
            total += samples.len();
        }
        assert_eq!(total, p.samples().len());
        assert_eq!(profiles[0]["name"], "app (10)");
    }
}
