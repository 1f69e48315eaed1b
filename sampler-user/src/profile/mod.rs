//! profile stage (being built).
