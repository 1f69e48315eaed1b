//! record tests (being written).
