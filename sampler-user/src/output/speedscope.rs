//! speedscope JSON: one "sampled" profile per process, in sample-time order, frames shared.
//! Schema: <https://www.speedscope.app/file-format-schema.json>.

use std::collections::BTreeMap;
use std::io::{self, Write};

use serde_json::{Value, json};

use super::Renderer;
use crate::profile::{FrameKind, Profile};

/// speedscope renderer.
pub struct Speedscope;

impl Renderer for Speedscope {
    fn render(&self, profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
        let frames: Vec<Value> = profile
            .frames()
            .iter()
            .map(|f| {
                let mut v = json!({ "name": f.label() });
                if let Some(file) = f.file.as_deref().or(f.module.as_deref()) {
                    v["file"] = json!(file);
                }
                if let Some(line) = f.line {
                    v["line"] = json!(line);
                }
                v
            })
            .collect();
        // Group samples by process; the process root frame becomes the profile's name.
        let mut by_pid: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for (i, s) in profile.samples().iter().enumerate() {
            by_pid.entry(s.pid).or_default().push(i);
        }
        let period_ns = 1_000_000_000 / profile.meta.rate_hz.max(1);
        let mut profiles = Vec::new();
        for (pid, mut idx) in by_pid {
            idx.sort_by_key(|&i| profile.samples()[i].time_ns);
            let first = &profile.samples()[idx[0]];
            let start = first.time_ns;
            let end = profile.samples()[idx[idx.len() - 1]].time_ns + period_ns;
            let mut name = format!("{} ({pid})", first.comm);
            let mut samples = Vec::with_capacity(idx.len());
            for &i in &idx {
                let stack = profile.stack(profile.samples()[i].stack);
                let (root, rest) = match stack.split_first() {
                    Some((r, rest)) if profile.frame(*r).kind == FrameKind::Process => {
                        (Some(r), rest)
                    }
                    _ => (None, stack),
                };
                if let Some(r) = root {
                    name = profile.frame(*r).name.to_string();
                }
                samples.push(rest.iter().map(|f| f.0).collect::<Vec<_>>());
            }
            profiles.push(json!({
                "type": "sampled",
                "name": name,
                "unit": "nanoseconds",
                "startValue": 0,
                "endValue": end - start,
                "samples": samples,
                "weights": vec![period_ns; idx.len()],
            }));
        }
        let doc = json!({
            "$schema": "https://www.speedscope.app/file-format-schema.json",
            "shared": { "frames": frames },
            "profiles": profiles,
            "name": "pyebpf",
            "activeProfileIndex": 0,
            "exporter": concat!("pyebpf ", env!("CARGO_PKG_VERSION")),
        });
        serde_json::to_writer(&mut *out, &doc).map_err(io::Error::other)?;
        writeln!(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
