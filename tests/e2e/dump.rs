//! dump tests (being written).
