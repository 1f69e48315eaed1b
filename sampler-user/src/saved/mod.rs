//! The saved profile (`.pyebpf`): every sample of a run with its metadata, to render any
//! output or `report` from later.

use std::io::{self, Write};
use std::path::Path;

use crate::output::Renderer;
use crate::profile::Profile;

/// Why a saved profile cannot be read. Displays as one line.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Reading the file failed.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: io::Error,
    },
}

/// Writer of the saved format.
pub struct Saved;

impl Renderer for Saved {
    fn render(&self, _profile: &Profile, _out: &mut dyn Write) -> io::Result<()> {
        Err(io::Error::other("the saved format is not implemented yet"))
    }
}

/// Reads a saved profile.
pub fn load(path: &Path) -> Result<Profile, LoadError> {
    Err(LoadError::Io {
        path: path.to_path_buf(),
        source: io::Error::other("the saved format is not implemented yet"),
    })
}
