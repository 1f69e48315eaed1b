//! Target memory, read through one trait (style rule 6).
//!
//! Owns: [`ReadMemory`] and its implementations — [`ProcessMemory`] (a live process through
//! `process_vm_readv(2)`, with a page-sized read cache that lives for one snapshot) and
//! [`ImageMemory`] (an in-memory image: recorded snapshots and synthetic test images).
//! Input: addresses in the target's address space. Output: bytes or a [`MemError`].
//! Constraints: target memory is untrusted and changes under us; a read never panics, a single
//! read is bounded by [`MAX_READ`], and the cache holds at most [`MAX_CACHED_PAGES`] pages.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

use crate::lru::Lru;

/// Largest single read the reader ever asks for; every caller bounds its lengths below this.
pub const MAX_READ: usize = 1 << 20;
/// Page size of the read cache.
pub const PAGE: usize = 4096;
/// Upper bound of the per-snapshot page cache (16 MiB).
pub const MAX_CACHED_PAGES: usize = 4096;

/// Why a read failed; turned into a `PyError` (with the pid) by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MemError {
    #[error("cannot read {len} bytes at {addr:#x}")]
    Fault { addr: u64, len: usize },
    #[error("the process is gone")]
    Gone,
    #[error("permission denied")]
    Permission,
    #[error("read of {len} bytes at {addr:#x} exceeds the reader's cap")]
    TooLarge { addr: u64, len: usize },
}

/// The only way the reader sees a target. Implementations must be safe against any address.
pub trait ReadMemory {
    /// Fills `buf` from `addr`, entirely or not at all.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError>;

    /// Forgets cached data, so a retry after a torn read sees the target as it is now.
    fn refresh(&self) {}

    fn read_u64(&self, addr: u64) -> Result<u64, MemError> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn read_u32(&self, addr: u64) -> Result<u32, MemError> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn read_i32(&self, addr: u64) -> Result<i32, MemError> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b)?;
        Ok(i32::from_le_bytes(b))
    }

    /// Reads `len` bytes into a new vector; `len` must be at most [`MAX_READ`].
    fn read_vec(&self, addr: u64, len: usize) -> Result<Vec<u8>, MemError> {
        if len > MAX_READ {
            return Err(MemError::TooLarge { addr, len });
        }
        let mut v = vec![0u8; len];
        self.read(addr, &mut v)?;
        Ok(v)
    }
}

/// Little-endian field access into a buffer that was read in one piece (e.g. a whole frame).
/// Out-of-bounds offsets yield `None`, never a panic.
pub fn field_u64(buf: &[u8], off: u64) -> Option<u64> {
    let off = usize::try_from(off).ok()?;
    let b = buf.get(off..off.checked_add(8)?)?;
    Some(u64::from_le_bytes(b.try_into().ok()?))
}

pub fn field_u32(buf: &[u8], off: u64) -> Option<u32> {
    let off = usize::try_from(off).ok()?;
    let b = buf.get(off..off.checked_add(4)?)?;
    Some(u32::from_le_bytes(b.try_into().ok()?))
}

pub fn field_u8(buf: &[u8], off: u64) -> Option<u8> {
    buf.get(usize::try_from(off).ok()?).copied()
}

/// A live process. Reads go through a page cache that [`ProcessMemory::new_snapshot`] empties;
/// within one snapshot every byte of a page comes from the same `process_vm_readv` call, so
/// fields that share a page are mutually consistent.
pub struct ProcessMemory {
    pid: u32,
    cache: RefCell<Lru<u64, Option<Box<[u8]>>>>,
}

impl ProcessMemory {
    pub fn new(pid: u32) -> ProcessMemory {
        ProcessMemory {
            pid,
            cache: RefCell::new(Lru::new(MAX_CACHED_PAGES)),
        }
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Forgets every cached page: the next reads see the target as it is now.
    pub fn new_snapshot(&self) {
        self.cache.borrow_mut().clear();
    }

    fn read_direct(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        if buf.is_empty() {
            return Ok(());
        }
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: `local` describes exactly `buf`, which we own mutably for the call; the
        // remote iovec is only interpreted by the kernel in the target's address space.
        let n = unsafe {
            libc::process_vm_readv(
                self.pid as libc::pid_t,
                &raw const local,
                1,
                &raw const remote,
                1,
                0,
            )
        };
        if n < 0 {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            return Err(match errno {
                libc::ESRCH => MemError::Gone,
                libc::EPERM | libc::EACCES => MemError::Permission,
                _ => MemError::Fault {
                    addr,
                    len: buf.len(),
                },
            });
        }
        if n as usize != buf.len() {
            return Err(MemError::Fault {
                addr: addr.wrapping_add(n as u64),
                len: buf.len() - n as usize,
            });
        }
        Ok(())
    }

    /// Fetches one page into the cache (or remembers that it is unreadable).
    fn page(&self, page_addr: u64) -> Result<(), MemError> {
        if self.cache.borrow_mut().get(&page_addr).is_some() {
            return Ok(());
        }
        let mut data = vec![0u8; PAGE].into_boxed_slice();
        let entry = match self.read_direct(page_addr, &mut data) {
            Ok(()) => Some(data),
            Err(MemError::Fault { .. }) => None,
            Err(e) => return Err(e),
        };
        self.cache.borrow_mut().insert(page_addr, entry);
        Ok(())
    }
}

impl ReadMemory for ProcessMemory {
    fn refresh(&self) {
        self.new_snapshot();
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        if buf.len() > MAX_READ {
            return Err(MemError::TooLarge {
                addr,
                len: buf.len(),
            });
        }
        let Some(end) = addr.checked_add(buf.len() as u64) else {
            return Err(MemError::Fault {
                addr,
                len: buf.len(),
            });
        };
        // Large reads bypass the cache (they would evict everything useful).
        if buf.len() > 4 * PAGE {
            return self.read_direct(addr, buf);
        }
        let mut cur = addr;
        while cur < end {
            let page_addr = cur & !(PAGE as u64 - 1);
            self.page(page_addr)?;
            let cache = self.cache.borrow();
            let page_end = page_addr.saturating_add(PAGE as u64);
            let chunk_end = end.min(page_end);
            let (src_lo, dst_lo) = ((cur - page_addr) as usize, (cur - addr) as usize);
            let n = (chunk_end - cur) as usize;
            match cache.peek(&page_addr) {
                Some(Some(page)) => {
                    buf[dst_lo..dst_lo + n].copy_from_slice(&page[src_lo..src_lo + n]);
                }
                _ => {
                    return Err(MemError::Fault {
                        addr,
                        len: buf.len(),
                    });
                }
            }
            cur = chunk_end;
        }
        Ok(())
    }
}

/// An in-memory image of (part of) an address space: non-overlapping regions by start address.
/// Used for recorded snapshots and for the synthetic images of the unit and fuzz tests; it also
/// records the largest read it was asked for, so tests can check that caps hold.
#[derive(Default, Clone)]
pub struct ImageMemory {
    regions: BTreeMap<u64, Vec<u8>>,
    max_read: Cell<usize>,
    reads: Cell<u64>,
}

impl ImageMemory {
    pub fn new() -> ImageMemory {
        ImageMemory::default()
    }

    /// Adds (or replaces) the region starting at `start`. Overlaps are the caller's problem:
    /// reads resolve to the region with the greatest start `<= addr`.
    pub fn insert(&mut self, start: u64, bytes: Vec<u8>) {
        self.regions.insert(start, bytes);
    }

    /// Mutable access to the bytes at `addr..addr+len`, if one region holds them all.
    pub fn bytes_mut(&mut self, addr: u64, len: usize) -> Option<&mut [u8]> {
        let (start, region) = self.regions.range_mut(..=addr).next_back()?;
        let lo = usize::try_from(addr - start).ok()?;
        region.get_mut(lo..lo.checked_add(len)?)
    }

    pub fn regions(&self) -> impl Iterator<Item = (u64, &Vec<u8>)> {
        self.regions.iter().map(|(a, v)| (*a, v))
    }

    pub fn regions_mut(&mut self) -> impl Iterator<Item = (u64, &mut Vec<u8>)> {
        self.regions.iter_mut().map(|(a, v)| (*a, v))
    }

    /// The largest single read seen so far.
    pub fn max_read(&self) -> usize {
        self.max_read.get()
    }

    pub fn reads(&self) -> u64 {
        self.reads.get()
    }
}

impl ReadMemory for ImageMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.reads.set(self.reads.get() + 1);
        self.max_read.set(self.max_read.get().max(buf.len()));
        if buf.len() > MAX_READ {
            return Err(MemError::TooLarge {
                addr,
                len: buf.len(),
            });
        }
        let fault = MemError::Fault {
            addr,
            len: buf.len(),
        };
        let (start, region) = self.regions.range(..=addr).next_back().ok_or(fault)?;
        let lo = usize::try_from(addr - start).map_err(|_| fault)?;
        let src = region
            .get(lo..lo.checked_add(buf.len()).ok_or(fault)?)
            .ok_or(fault)?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_reads_within_regions_only() {
        let mut m = ImageMemory::new();
        m.insert(0x1000, (0u8..16).collect());
        assert_eq!(
            m.read_u32(0x1004).unwrap(),
            u32::from_le_bytes([4, 5, 6, 7])
        );
        assert!(m.read_u64(0x100c).is_err(), "crosses the end of the region");
        assert!(m.read_u64(0xfff).is_err());
        assert!(m.read_u64(u64::MAX - 2).is_err());
        assert!(matches!(
            m.read_vec(0x1000, MAX_READ + 1),
            Err(MemError::TooLarge { .. })
        ));
    }

    #[test]
    fn fields_out_of_bounds_are_none() {
        let b = [1u8, 0, 0, 0, 0, 0, 0, 0, 9];
        assert_eq!(field_u64(&b, 0), Some(1));
        assert_eq!(field_u64(&b, 2), None);
        assert_eq!(field_u8(&b, 8), Some(9));
        assert_eq!(field_u32(&b, u64::MAX), None);
    }

    #[test]
    fn process_memory_reads_self_and_maps_errors() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let m = ProcessMemory::new(std::process::id());
        let mut out = vec![0u8; 9000];
        m.read(data.as_ptr() as u64 + 100, &mut out).unwrap();
        assert_eq!(&out[..], &data[100..9100]);
        let mut small = [0u8; 3];
        m.read(data.as_ptr() as u64 + 4094, &mut small).unwrap();
        assert_eq!(&small[..], &data[4094..4097]);
        assert!(matches!(m.read_u64(8), Err(MemError::Fault { .. })));
        // A pid that cannot exist (above pid_max's hard limit).
        let gone = ProcessMemory::new(0x7fff_fff0);
        assert_eq!(gone.read_u64(data.as_ptr() as u64), Err(MemError::Gone));
    }
}
