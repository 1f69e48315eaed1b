//! Issue 4 end-to-end tests (being written).
