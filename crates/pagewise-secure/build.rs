//! Tells the core's test files that they are built against this package,
//! whose library is `pagewise_secure`: they then take it under the name
//! `pagewise` (`extern crate pagewise_secure as pagewise;`).
fn main() {
    println!("cargo:rustc-cfg=pagewise_secure_package");
}
