//! What a test does when a program it needs (python3) is missing.

#![allow(dead_code)]

#[path = "../../../pagewise-c/tests/common/missing.rs"]
mod missing;
pub use missing::missing;
