//! symbolize stage (being built).
