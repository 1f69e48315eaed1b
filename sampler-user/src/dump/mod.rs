//! The `dump` command's native part: stopping a thread (`ptrace`) and merging its native frames
//! with its Python frames (`native`).

pub mod native;
pub mod ptrace;
