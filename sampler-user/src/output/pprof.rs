//! pprof output: a gzipped `perftools.profiles.Profile` (profile.proto), encoded with prost.

use std::io::{self, Write};

use super::Renderer;
use crate::profile::Profile;

/// pprof renderer.
pub struct Pprof;

impl Renderer for Pprof {
    fn render(&self, _profile: &Profile, _out: &mut dyn Write) -> io::Result<()> {
        Err(io::Error::other("pprof output is not implemented yet"))
    }
}
