//! What a test does when something it needs from the system is missing.

#![allow(dead_code)]

#[path = "../../../pagewise-c/tests/common/missing.rs"]
mod missing;
pub use missing::missing;
