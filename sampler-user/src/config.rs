//! Validated configuration (being built).
