//! merge stage (being built).
