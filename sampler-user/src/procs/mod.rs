//! procs stage (being built).
