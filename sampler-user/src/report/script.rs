//! `pyebpf script`: one block per sample in the `perf script` layout.

use std::io::{self, Write};

use crate::profile::Profile;

/// Writes every sample in `perf script` layout.
pub fn render(_profile: &Profile, _out: &mut dyn Write) -> io::Result<()> {
    Err(io::Error::other("script is not implemented yet"))
}
