//! unwind stage (being built).
