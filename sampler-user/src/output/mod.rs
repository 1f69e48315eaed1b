//! output stage (being built).
