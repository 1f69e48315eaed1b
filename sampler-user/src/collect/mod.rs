//! collect stage (being built).
