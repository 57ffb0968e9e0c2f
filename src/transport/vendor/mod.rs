//! The NCCL / RCCL library, loaded at run time (features `cuda` / `rocm`).
//!
//! One loader serves both vendors: RCCL exports NCCL's API under NCCL's names, with a
//! few differences of spelling (all-to-all is `ncclAllToAll` in RCCL, `ncclAlltoAll` in
//! NCCL 2.28+, absent before) and of availability (`ncclCommSplit` needs NCCL 2.18).
//! Layers as cudarc's: raw symbols (`sys`), one place where result codes become
//! [`Result`] ([`VendorLib::check`]), safe calls on top. The library loads once per
//! process (a `OnceLock` over a list of candidates): `STRATA_NCCL_LIB` /
//! `STRATA_RCCL_LIB` first, then the usual sonames. A library that cannot be found is
//! an [`Error::System`] naming every candidate tried and why it failed, never a panic,
//! so strata builds and runs on machines without the library.
//!
//! # Aborts never free a communicator a call is inside
//!
//! strata's vendor communicators are blocking ones (NCCL only allows `ncclCommAbort`
//! concurrently with other calls on nonblocking communicators). So every vendor call on
//! a [`VendorComm`] holds a use guard ([`VendorComm::enter`], an [`InUse`]) for as long
//! as the library may touch the handle: the call itself, or for calls enqueued inside
//! `ncclGroupStart`/`ncclGroupEnd`, until the group has ended; a helper thread inside
//! `ncclCommSplit` holds the parent's guard until the split returns. An abort
//! ([`AbortHandle::abort`], [`VendorComm::abort_in_place`], from any thread, without any
//! lock) marks the communicator aborted at once: every later call fails before reaching
//! the library, with an [`Error::Remote`] naming the abort. The `ncclCommAbort` itself
//! runs when the last guard is dropped (on that thread), or at once when no call is
//! inside; dropping the [`VendorComm`] (`ncclCommDestroy`) is deferred the same way. It
//! runs exactly once. The bookkeeping is [`UseCount`], generic and unit-tested without
//! a library.
//!
//! The price: a call that blocks inside the library (a split or init whose peers never
//! come) cannot be woken by an abort. `ncclCommInitRank` and `ncclCommSplit` therefore
//! run on a helper thread ([`VendorLib::comm_init_rank_within`],
//! [`VendorComm::split_within`]); past the timeout the caller gets `Remote` at once, the
//! parent is marked aborted, and its abort (and that of a communicator the library
//! still completes late) runs if and when the helper returns.

mod abort;
mod comm;
mod loader;
#[cfg(test)]
mod tests;

pub use abort::{AbortHandle, Ending, InUse, Teardown, Use, UseCount};
pub use comm::{Reduction, VendorComm, SPLIT_NOCOLOR};
pub use loader::{RawComm, RawStream, Vendor, VendorLib, VendorUniqueId, VENDOR_UNIQUE_ID_BYTES};
