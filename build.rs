//! Links the napi addon (with the `node` feature); nothing to do without it.

fn main() {
    #[cfg(feature = "node")]
    napi_build::setup();
}
