//! BPF_MAP_LOOKUP_BATCH, which aya 0.14 does not offer: many entries of a map in one syscall.
//! Status and /metrics read every peer's counters, and one lookup per peer made a read at
//! 60,000 peers 60,000 syscalls (about 0.1 s), all of it under the dataplane's lock, where
//! reconciles and lease changes waited for it.

use anyhow::{ensure, Context};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `enum bpf_cmd`'s BPF_MAP_LOOKUP_BATCH (linux/bpf.h).
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
/// Keys asked for in one call: a per-CPU array's values of 4,096 keys are 128 KiB per CPU.
const KEYS_PER_CALL: u32 = 4096;

/// `union bpf_attr`'s member for the BPF_MAP_*_BATCH commands.
#[repr(C)]
#[derive(Debug, Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// The kernel's ENOTSUPP (524, not in libc): what a map type without batch operations answers,
/// a per-CPU array before Linux 5.13.
const ENOTSUPP: i32 = 524;

/// The values of keys `0..count` of the array map `map`, in key order, `per_key` of them to a
/// key (a per-CPU array's: one per possible CPU, each `T` a multiple of 8 bytes long, as the
/// kernel lays them out). `Ok(None)` where the kernel has no batch lookup for the map's type:
/// the caller reads key by key then.
pub(crate) fn array_values<T: aya::Pod + Default>(
    map: BorrowedFd<'_>,
    count: u32,
    per_key: usize,
) -> anyhow::Result<Option<Vec<T>>> {
    ensure!(
        size_of::<T>().is_multiple_of(8),
        "a per-CPU value's size is a multiple of 8"
    );
    let mut values: Vec<T> = std::iter::repeat_with(T::default)
        .take(count as usize * per_key)
        .collect();
    let mut keys = vec![0u32; KEYS_PER_CALL as usize];
    let mut read = 0u32;
    let mut last = 0u32;
    let last_ptr = &raw mut last;
    while read < count {
        let mut attr = BatchAttr {
            // The kernel starts after in_batch's key (from the first key without one) and
            // leaves the last key it read in out_batch.
            in_batch: if read == 0 { 0 } else { last_ptr as u64 },
            out_batch: last_ptr as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values[read as usize * per_key..].as_mut_ptr() as u64,
            count: (count - read).min(KEYS_PER_CALL),
            map_fd: map.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: attr is the batch member of bpf_attr; keys holds `attr.count` u32 keys and
        // values, from where it points, `attr.count * per_key` values of T (Pod, any bit
        // pattern is one); in_batch and out_batch point at a live u32, the key's size.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &raw mut attr,
                size_of::<BatchAttr>(),
            )
        };
        // ENOENT: the map has no more keys; count says how many came before the end.
        let errno = (rc < 0).then(|| io::Error::last_os_error().raw_os_error());
        if read == 0 && errno == Some(Some(ENOTSUPP)) {
            return Ok(None);
        }
        let ended = errno == Some(Some(libc::ENOENT));
        if rc < 0 && !ended {
            return Err(io::Error::last_os_error()).context("BPF_MAP_LOOKUP_BATCH");
        }
        let got = attr.count;
        let in_order = keys[..got as usize]
            .iter()
            .zip(read..)
            .all(|(key, want)| *key == want);
        ensure!(in_order, "BPF_MAP_LOOKUP_BATCH gave keys out of order");
        read += got;
        if ended || got == 0 {
            break;
        }
    }
    ensure!(read == count, "the map holds {read} keys, not {count}");
    Ok(Some(values))
}
