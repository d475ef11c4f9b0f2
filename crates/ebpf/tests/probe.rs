//! The probe on this machine's kernel (6.18, root): it loads the programs and decapsulates a
//! crafted datagram, and finds nothing missing.

#[test]
fn this_kernel_runs_the_dataplane() {
    twill_lab::require_root().unwrap();
    assert_eq!(twill_ebpf::probe(), Ok(()));
}
