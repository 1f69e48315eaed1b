//! Empty: this crate only holds the end-to-end test binary (`e2e/`) and its workloads.
