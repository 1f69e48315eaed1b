//! record stage (being built).
