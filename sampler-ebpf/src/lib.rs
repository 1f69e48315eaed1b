//! Empty host-side library so that `sampler-user` can name this crate as a build dependency
//! (aya-build rebuilds the eBPF object when it changes).
#![no_std]
