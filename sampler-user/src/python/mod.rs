//! python stage (being built).
