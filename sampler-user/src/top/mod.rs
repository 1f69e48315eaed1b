//! `pyebpf top`: a live, host-wide view of where CPU time goes, refreshed every second.

/// What `top` samples (from the CLI flags).
#[derive(Clone, Debug, Default)]
pub struct TopConfig {
    /// `-p`: only these processes (empty: the whole host).
    pub pids: Vec<u32>,
    /// Samples per second, per CPU.
    pub rate_hz: u64,
    /// Include native frames.
    pub native: bool,
}

/// Why `top` stopped with an error. Displays as one line.
#[derive(Debug, thiserror::Error)]
pub enum TopError {
    /// Not implemented yet.
    #[error("top is not implemented yet")]
    NotYet,
}

/// Runs `top` until `q` or Ctrl-C.
pub fn run(_cfg: &TopConfig) -> Result<(), TopError> {
    Err(TopError::NotYet)
}
