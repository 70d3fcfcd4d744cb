//! Link flags of the extension module.

fn main() {
    // Bind every symbol when the module is loaded (`-z now`), not on first call: the warm
    // interpreter loads it once, and each run forked from it would otherwise resolve (and
    // write into a copied page) every libc function that only runs use, such as `mount`.
    println!("cargo:rustc-link-arg-cdylib=-Wl,-z,now");
}
