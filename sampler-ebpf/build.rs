//! Rebuild the eBPF object when bpf-linker changes (it is the linker, not a dependency cargo
//! sees), and declare the `bpf_target_arch` cfg that aya-build passes to the compiler.
fn main() {
    println!(
        "cargo::rustc-check-cfg=cfg(bpf_target_arch, values(\"x86_64\", \"aarch64\", \"arm\", \
         \"loongarch64\", \"mips\", \"powerpc64\", \"riscv64\", \"s390x\"))"
    );
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
