//! Gives the cdylib its own soname, `libhetccl.so` (not `libnccl.so.2`), so
//! that the real NCCL can still be opened next to it as a fallback.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libhetccl.so");
    println!("cargo:rerun-if-changed=build.rs");
}
