//! GIL state of an interpreter and of its threads.
//!
//! Owns: [`InterpGil`] (read from the `_gil_runtime_state` the interpreter uses: the
//! process-wide `_PyRuntime.ceval.gil` up to 3.11, the interpreter's own from 3.12) and the
//! per-thread verdict [`thread_gil`].
//! Input: a [`Ctx`] and an interpreter address. Output: who holds the GIL, or that the
//! free-threaded runtime runs without one.
//! Constraints: `last_holder` is not cleared on release, so `locked` is checked first; the two
//! words are read in one read (they share a cache line) to limit tearing; the struct is reached
//! through `ceval.gil` (a sub-interpreter sharing the main GIL points at the main one).
//! Fields: `struct _gil_runtime_state` in `Include/internal/pycore_gil.h`
//! (<https://github.com/python/cpython/blob/v3.13.0/Include/internal/pycore_gil.h>), the
//! interp-relative `gil_runtime_state_*` debug offsets; docs/cpython-layouts.md §6.

use super::GilState;
use super::code::Ctx;
use super::layout::GilAt;
use super::memory::{MemError, field_u32, field_u64};

/// The GIL of one interpreter at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterpGil {
    /// Free-threaded build running with the GIL disabled (`enabled == 0`).
    Disabled,
    /// Locked, by the thread state at this address.
    HeldBy(u64),
    /// Nobody holds it.
    Free,
}

/// The address of the `_gil_runtime_state` the interpreter at `interp` uses.
pub fn gil_struct(ctx: Ctx<'_>, interp: u64) -> Result<u64, MemError> {
    Ok(match ctx.layout.gil.at {
        GilAt::Runtime { offset } => ctx.target.runtime.wrapping_add(offset),
        GilAt::Interpreter {
            ceval_gil,
            embedded,
        } => match ctx.mem.read_u64(interp.wrapping_add(ceval_gil))? {
            0 => interp.wrapping_add(embedded),
            p => p,
        },
    })
}

/// Reads the GIL used by the interpreter at `interp`.
pub fn read_interp_gil(ctx: Ctx<'_>, interp: u64) -> Result<InterpGil, MemError> {
    let g = &ctx.layout.gil;
    let gil = gil_struct(ctx, interp)?;
    if let Some(enabled) = g.enabled
        && ctx.mem.read_i32(gil.wrapping_add(enabled))? == 0
    {
        return Ok(InterpGil::Disabled);
    }
    let bad = MemError::Fault { addr: gil, len: 0 };
    let (locked, holder) = (g.locked, g.last_holder);
    let lo = locked.min(holder);
    let hi = (locked + 4).max(holder + 8);
    if hi - lo > 256 {
        return Err(bad);
    }
    let span = ctx.mem.read_vec(gil.wrapping_add(lo), (hi - lo) as usize)?;
    let is_locked = field_u32(&span, locked - lo).ok_or(bad)? != 0;
    let last_holder = field_u64(&span, holder - lo).ok_or(bad)?;
    Ok(if is_locked && last_holder != 0 {
        InterpGil::HeldBy(last_holder)
    } else {
        InterpGil::Free
    })
}

/// The verdict for one thread: the interpreter's GIL if it was readable, else the thread
/// state's own `holds_gil` flag (3.13+), else unknown.
pub fn thread_gil(gil: Option<InterpGil>, tstate: u64, holds_gil: Option<bool>) -> GilState {
    match (gil, holds_gil) {
        (Some(InterpGil::Disabled), _) => GilState::NoGil,
        (Some(InterpGil::HeldBy(h)), _) if h == tstate => GilState::Holds,
        (Some(InterpGil::HeldBy(_) | InterpGil::Free), _) | (None, Some(false)) => {
            GilState::DoesNotHold
        }
        (None, Some(true)) => GilState::Holds,
        (None, None) => GilState::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::testimage::{Flavor, ImageBuilder};

    #[test]
    fn holder_free_and_disabled() {
        for flavor in Flavor::ALL {
            let mut b = ImageBuilder::new(flavor);
            let interp = b.interp_addr();
            b.set_gil(Some(0xdead_0000), flavor.is_ft().then_some(1));
            let (mem, layout, target) = (b.memory(), b.layout().clone(), b.target());
            let ctx = Ctx {
                mem: &mem,
                layout: &layout,
                target: &target,
            };
            assert_eq!(
                read_interp_gil(ctx, interp).unwrap(),
                InterpGil::HeldBy(0xdead_0000),
                "{flavor:?}"
            );
            b.set_gil(None, None);
            let mem = b.memory();
            let ctx = Ctx {
                mem: &mem,
                layout: &layout,
                target: &target,
            };
            assert_eq!(read_interp_gil(ctx, interp).unwrap(), InterpGil::Free);
            if flavor.is_ft() {
                b.set_gil(Some(0xdead_0000), Some(0));
                let mem = b.memory();
                let ctx = Ctx {
                    mem: &mem,
                    layout: &layout,
                    target: &target,
                };
                assert_eq!(read_interp_gil(ctx, interp).unwrap(), InterpGil::Disabled);
            }
        }
    }

    #[test]
    fn verdicts() {
        assert_eq!(
            thread_gil(Some(InterpGil::HeldBy(5)), 5, None),
            GilState::Holds
        );
        assert_eq!(
            thread_gil(Some(InterpGil::HeldBy(5)), 6, Some(true)),
            GilState::DoesNotHold
        );
        assert_eq!(
            thread_gil(Some(InterpGil::Disabled), 6, Some(true)),
            GilState::NoGil
        );
        assert_eq!(thread_gil(None, 6, Some(true)), GilState::Holds);
        assert_eq!(thread_gil(None, 6, None), GilState::Unknown);
    }
}
