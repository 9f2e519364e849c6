//! Builds the in-container shim (`sandbox/shim`) as a static Linux binary
//! and hands its path to `src/shim.rs`, which embeds it: the kernel binary
//! then carries the exact shim it speaks to, with nothing to install.
//!
//! The shim is built by a nested cargo into its own target dir (the outer
//! build holds the lock of the main one), for the same target triple, with
//! `+crt-static` (no dynamic loader needed in the image) and the `shim`
//! profile of the workspace's Cargo.toml.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(env("CARGO_MANIFEST_DIR"));
    let shim = manifest.join("shim");
    for watched in ["src", "Cargo.toml"] {
        println!("cargo:rerun-if-changed={}", shim.join(watched).display());
    }
    // the lock file and the workspace manifest (its `shim` profile)
    println!("cargo:rerun-if-changed=../Cargo.lock");
    println!("cargo:rerun-if-changed=../Cargo.toml");
    let target = env("TARGET");
    let out = PathBuf::from(env("OUT_DIR"));
    // shared by every profile of the outer build: target/shim
    let target_dir = out
        .ancestors()
        .nth(4)
        .map(|t| t.join("shim"))
        .unwrap_or_else(|| out.join("shim"));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .args([
            "build",
            "--offline",
            "--profile",
            "shim",
            "--bin",
            "opkernel-shim",
        ])
        .arg("--manifest-path")
        .arg(shim.join("Cargo.toml"))
        .args(["--target", &target])
        .arg("--target-dir")
        .arg(&target_dir)
        .env("CARGO_ENCODED_RUSTFLAGS", "-Ctarget-feature=+crt-static");
    // what the outer cargo set for itself must not leak into the nested
    // build (its jobserver, CARGO_MAKEFLAGS, is shared on purpose)
    for var in [
        "RUSTFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_PRIMARY_PACKAGE",
        "__CARGO_FIX_PLZ",
    ] {
        build.env_remove(var);
    }
    let status = build
        .status()
        .unwrap_or_else(|e| panic!("cannot run cargo to build opkernel-shim: {e}"));
    assert!(status.success(), "building the static opkernel-shim failed");
    let binary = target_dir.join(&target).join("shim").join("opkernel-shim");
    assert!(binary.is_file(), "no shim at {}", binary.display());
    println!("cargo:rustc-env=OPKERNEL_SHIM_BINARY={}", binary.display());
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("cargo did not set {name}"))
}
