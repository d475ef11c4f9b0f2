//! Compiles the eBPF programs in bpf/ with clang on every build; the object is embedded with
//! `include_bytes!` (src/object.rs). The kernel's UAPI headers and libbpf's come from apt
//! (linux-libc-dev, libbpf-dev; scripts/setup installs them with clang).

use std::env;
use std::path::PathBuf;
use std::process::Command;

const SOURCE: &str = "bpf/udp.bpf.c";
const HEADERS: [&str; 4] = ["bpf/maps.h", "bpf/packet.h", "bpf/ingress.h", "bpf/icmp.h"];

fn main() {
    for path in std::iter::once(SOURCE).chain(HEADERS) {
        println!("cargo:rerun-if-changed={path}");
    }
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("udp.bpf.o");
    // <asm/types.h> lives in the host's multiarch directory, which `-target bpf` does not search.
    let arch = env::var("CARGO_CFG_TARGET_ARCH").expect("cargo sets CARGO_CFG_TARGET_ARCH");
    let multiarch = format!("-I/usr/include/{arch}-linux-gnu");
    let output = Command::new("clang")
        .args([
            "-target", "bpf", "-O2", "-g", "-Wall", "-Werror", &multiarch, "-c", SOURCE, "-o",
        ])
        .arg(&out)
        .output();
    match output {
        Err(e) => panic!(
            "twill-ebpf: cannot run clang ({e}); building the eBPF programs needs clang, llvm and \
             libbpf-dev: run scripts/setup"
        ),
        Ok(o) if !o.status.success() => panic!(
            "twill-ebpf: clang failed on {SOURCE}:\n{}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Ok(_) => {}
    }
}
