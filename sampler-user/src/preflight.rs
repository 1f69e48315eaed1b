//! Pre-flight checks (being built).
