//! The forwarded half of NCCL's API ([`crate::symbols::FORWARDED`]): one exported
//! trampoline per name that jumps to the real `libnccl.so.2`'s function of the same name
//! with every register and the stack untouched, so any signature works (arguments in
//! registers or on the stack, varargs, struct returns through a hidden pointer or in
//! `rax:rdx`) without this library knowing it.
//!
//! # How a call travels (x86_64)
//!
//! - Trampoline `ncclX` (slot `i`): `lea r11, [rip + SLOTS + 8*i]; jmp [r11]`. `r11` is
//!   the System V ABI's scratch register that no argument uses; it carries the slot's
//!   address to whatever the slot holds.
//! - Every slot starts at `lazy` (nothing is resolved, nothing loaded: a process that
//!   never calls a forwarded function never loads libnccl from here). `lazy` pushes `rbp`,
//!   `rdi rsi rdx rcx r8 r9` (integer arguments, `rdi` also the hidden struct-return
//!   pointer), `rax` (the vector-register count of a varargs call), `r10` (static chain),
//!   `r11` (the slot), then `xmm0`-`xmm7` (the vector arguments, low 128 bits: no NCCL
//!   function takes a wider vector), aligns `rsp` down to 16 bytes (`and rsp, -16`, so an
//!   ABI-violating caller cannot make the call below fault on alignment), calls
//!   [`resolve_all`], restores everything exactly (`rsp` from `rbp`), and jumps through
//!   `[r11]`: the resolved function sees the registers and stack of the original call, and
//!   returns straight to the original caller.
//! - [`resolve_all`] fills every slot once, under a [`Once`] (concurrent first calls wait
//!   for it): the real library's `pncclX` (the strong symbol; `ncclX` there is a weak
//!   alias of the same code), else its `ncclX` (`ncclResetDebugInitInternal` has no
//!   `p` twin). The stores are `Release`; the trampolines' loads are plain `mov`s, which
//!   x86's ordering (TSO) makes acquire loads.
//!
//! # No real library, or strata's CPU device
//!
//! A slot that cannot be forwarded gets a stub of its function's return kind ([`Kind`]),
//! which reads the slot from `r11` to name the function, records why in
//! [`last_error`], and returns:
//! - `ncclResult_t` functions (most): `ncclInvalidUsage` (5).
//! - `int` functions (`ncclLLA2ACalcSlots`, `ncclTeamRankToWorld`, `ncclTeamRankToLsa`):
//!   `-1` (no slot count, no rank).
//! - `ncclTeam_t` functions (`ncclTeamWorld`, `ncclTeamLsa`, `ncclTeamCft`,
//!   `ncclTeamCftMultimem`, `ncclTeamRail`, 12 bytes returned in `rax:rdx`): the empty team
//!   `{nRanks 0, rank -1, stride 0}`. They describe a device communicator of the real
//!   library, which cannot exist without it.
//! - `void` functions (`ncclParamDumpAll`, `ncclResetDebugInit`,
//!   `ncclResetDebugInitInternal`): nothing.
//!
//! When: no real library ([`crate::real::real`] is `None`): every slot. With a real
//! library but `STRATA_NCCL_DEVICE=cpu` ([`crate::real::cpu_device`]): the communicators
//! are strata's, which the real library must never receive, so the functions that take
//! a communicator, window or device communicator get the stub; the others (parameters,
//! debug, encryption, the requirement helpers that take sizes or a team value) are still
//! forwarded. A real library that lacks a name (an older NCCL): that slot.
//!
//! # aarch64 (Grace: GH200, GB200)
//!
//! The same design in AAPCS64's registers. Trampoline: `adrp x16, SLOTS; add x16, x16,
//! :lo12:SLOTS; add x16, x16, #8*i; ldar x17, [x16]; br x17`. `x16` and `x17` are the
//! intra-procedure-call scratch registers (a linker veneer may clobber them between a
//! caller and its callee), so no argument lives there; `ldar` is an acquire load,
//! pairing with [`resolve_all`]'s release stores on a weakly ordered machine. `lazy`
//! saves `x29`/`x30` (it calls, and `x30` holds the original caller's return address),
//! `x0`-`x7` (arguments), `x8` (the indirect result pointer), `x16` (the slot) and
//! `q0`-`q7` (the vector arguments, whole), 16-byte pairs so `sp` stays aligned as the
//! hardware requires, calls [`resolve_all`], restores them in mirror order and jumps
//! through the slot. The stubs move the slot from `x16` to `x0` and tail-call their
//! Rust function. Variadic calls need nothing more on Linux (AAPCS64 passes them as
//! fixed arguments). Checked under `qemu-aarch64` against the stand-in library
//! (`nccl/tests/forward.rs`, docs/nccl.md).
//!
//! Other architectures: not built (`compile_error!`).

use crate::symbols::FORWARDED;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, Once};

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!(
    "strata-nccl's forwarding trampolines (src/forward.rs) are written for x86_64 and aarch64"
);

/// Number of forwarded functions (one slot and one trampoline each).
const N: usize = FORWARDED.len();

/// The slot of each forwarded function, in [`FORWARDED`]'s order: `lazy` until
/// [`resolve_all`] ran, then the real function or an unavailable stub.
static SLOTS: [AtomicPtr<()>; N] = [const { AtomicPtr::new(lazy as *mut ()) }; N];

/// Index of `name` in [`FORWARDED`]; a trampoline for a name not listed there does not
/// compile (the panic runs at compile time).
const fn index_of(name: &str) -> usize {
    let mut i = 0;
    while i < N {
        if str_eq(FORWARDED[i], name) {
            return i;
        }
        i += 1;
    }
    panic!("a trampoline for a name that symbols::FORWARDED does not list");
}

const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

macro_rules! trampolines {
    ($($name:ident),* $(,)?) => {
        $(
            /// Forwarded to the real libnccl's function of this name (module doc).
            #[cfg(target_arch = "x86_64")]
            #[unsafe(no_mangle)]
            #[unsafe(naked)]
            unsafe extern "C" fn $name() {
                // SAFETY: two instructions that touch only r11 (caller-saved scratch, no
                // argument lives there) and jump through this function's slot, which
                // always holds a function that expects exactly this state (`lazy`, a
                // real NCCL function of this name, or a stub for this name's kind).
                core::arch::naked_asm!(
                    "lea r11, [rip + {slots} + {off}]",
                    "jmp qword ptr [r11]",
                    slots = sym SLOTS,
                    off = const 8 * index_of(stringify!($name)),
                )
            }

            /// Forwarded to the real libnccl's function of this name (module doc).
            #[cfg(target_arch = "aarch64")]
            #[unsafe(no_mangle)]
            #[unsafe(naked)]
            unsafe extern "C" fn $name() {
                // SAFETY: touches only x16/x17 (the intra-procedure-call scratch pair, no
                // argument lives there) and jumps through this function's slot (acquire
                // load), which always holds a function that expects exactly this state.
                core::arch::naked_asm!(
                    "adrp x16, {slots}",
                    "add x16, x16, :lo12:{slots}",
                    "add x16, x16, #{off}",
                    "ldar x17, [x16]",
                    "br x17",
                    slots = sym SLOTS,
                    off = const 8 * index_of(stringify!($name)),
                )
            }
        )*

        /// The trampolines, in the order they are written here.
        const TRAMPOLINES: &[(&str, unsafe extern "C" fn())] = &[$((stringify!($name), $name)),*];
    };
}

trampolines!(
    ncclCommGetUniqueId,
    ncclCommGrow,
    ncclCommMemStats,
    ncclCommQueryProperties,
    ncclCommResume,
    ncclCommRevoke,
    ncclCommSuspend,
    ncclDevCommCreate,
    ncclDevCommDestroy,
    ncclGetCftDeviceLeInfo,
    ncclGetLsaDevicePointer,
    ncclGetLsaMultimemDevicePointer,
    ncclGetMultimemDeviceLeInfo,
    ncclGetMultimemDevicePointer,
    ncclGetPeerDeviceLeInfo,
    ncclGetPeerDevicePointer,
    ncclGinBarrierCreateRequirement,
    ncclGinInboxA2ACreateRequirement,
    ncclGinOutboxCreateRequirement,
    ncclLLA2ACalcSlots,
    ncclLLA2ACreateRequirement,
    ncclLsaBarrierCreateRequirement,
    ncclParamBind,
    ncclParamDumpAll,
    ncclParamGet,
    ncclParamGetAllParameterKeys,
    ncclParamGetI16,
    ncclParamGetI32,
    ncclParamGetI64,
    ncclParamGetI8,
    ncclParamGetParameter,
    ncclParamGetStr,
    ncclParamGetU16,
    ncclParamGetU32,
    ncclParamGetU64,
    ncclParamGetU8,
    ncclPutSignal,
    ncclResetDebugInit,
    ncclResetDebugInitInternal,
    ncclSetEncryption,
    ncclSignal,
    ncclTeamCft,
    ncclTeamCftMultimem,
    ncclTeamLsa,
    ncclTeamRail,
    ncclTeamRankToLsa,
    ncclTeamRankToWorld,
    ncclTeamWorld,
    ncclWaitSignal,
    ncclWinGetUserPtr,
);

// Every forwarded name has its trampoline: with `index_of` (each trampoline's name is
// listed), equal counts mean the two lists are the same set when the names are distinct,
// which `tests::trampolines_match_forwarded` checks.
const _: () = assert!(TRAMPOLINES.len() == N);

/// The first call of any forwarded function lands here (module doc: what it saves and
/// why), resolves every slot, and continues into the resolved function.
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
unsafe extern "C" fn lazy() {
    // SAFETY: entered only by a branch from a trampoline (x16 = its slot, x30 = the
    // original caller's return address, the stack as the caller left it: 16-byte
    // aligned). Every register an argument, the result pointer, the slot or the return
    // address can live in is stored in 16-byte pairs and loaded back in mirror order, so
    // `sp` is exact and aligned throughout; `resolve_all` preserves the callee-saved
    // registers and leaves the slot holding a valid target.
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-16]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #-16]!",
        "stp x2, x3, [sp, #-16]!",
        "stp x4, x5, [sp, #-16]!",
        "stp x6, x7, [sp, #-16]!",
        "stp x8, x16, [sp, #-16]!",
        "stp q0, q1, [sp, #-32]!",
        "stp q2, q3, [sp, #-32]!",
        "stp q4, q5, [sp, #-32]!",
        "stp q6, q7, [sp, #-32]!",
        "bl {resolve}",
        "ldp q6, q7, [sp], #32",
        "ldp q4, q5, [sp], #32",
        "ldp q2, q3, [sp], #32",
        "ldp q0, q1, [sp], #32",
        "ldp x8, x16, [sp], #16",
        "ldp x6, x7, [sp], #16",
        "ldp x4, x5, [sp], #16",
        "ldp x2, x3, [sp], #16",
        "ldp x0, x1, [sp], #16",
        "ldp x29, x30, [sp], #16",
        "ldar x17, [x16]",
        "br x17",
        resolve = sym resolve_all,
    )
}

/// The first call of any forwarded function lands here (module doc: what it saves and
/// why), resolves every slot, and continues into the resolved function.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
unsafe extern "C" fn lazy() {
    // SAFETY: entered only by a jump from a trampoline (r11 = its slot, the stack as the
    // original caller left it). Everything an argument or the slot can live in is pushed
    // and popped in mirror order; `rbp` (callee-saved) anchors the frame so `rsp` comes
    // back exactly whatever the alignment step did; the call happens with `rsp` 16-byte
    // aligned as the ABI requires; `resolve_all` preserves the callee-saved registers
    // and leaves the slot holding a valid target.
    core::arch::naked_asm!(
        "push rbp",
        "mov rbp, rsp",
        "push rdi",
        "push rsi",
        "push rdx",
        "push rcx",
        "push r8",
        "push r9",
        "push rax",
        "push r10",
        "push r11",
        "sub rsp, 128",
        "and rsp, -16",
        "movdqu [rsp + 0], xmm0",
        "movdqu [rsp + 16], xmm1",
        "movdqu [rsp + 32], xmm2",
        "movdqu [rsp + 48], xmm3",
        "movdqu [rsp + 64], xmm4",
        "movdqu [rsp + 80], xmm5",
        "movdqu [rsp + 96], xmm6",
        "movdqu [rsp + 112], xmm7",
        "call {resolve}",
        "movdqu xmm0, [rsp + 0]",
        "movdqu xmm1, [rsp + 16]",
        "movdqu xmm2, [rsp + 32]",
        "movdqu xmm3, [rsp + 48]",
        "movdqu xmm4, [rsp + 64]",
        "movdqu xmm5, [rsp + 80]",
        "movdqu xmm6, [rsp + 96]",
        "movdqu xmm7, [rsp + 112]",
        // The nine registers pushed after rbp end 72 bytes below it.
        "lea rsp, [rbp - 72]",
        "pop r11",
        "pop r10",
        "pop rax",
        "pop r9",
        "pop r8",
        "pop rcx",
        "pop rdx",
        "pop rsi",
        "pop rdi",
        "pop rbp",
        "jmp qword ptr [r11]",
        resolve = sym resolve_all,
    )
}

/// A forwarded function's return type, which decides what it returns when it cannot
/// be forwarded (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `ncclResult_t`: `ncclInvalidUsage`.
    Result,
    /// `int`: `-1`.
    Int,
    /// `ncclTeam_t` (`struct {int nRanks, rank, stride;}`): `{0, -1, 0}`.
    Team,
    /// `void`.
    Void,
}

/// The return kind of forwarded function `name` (NCCL 2.32.3's `nccl.h` and
/// `nccl_device/host.h`).
pub fn kind(name: &str) -> Kind {
    match name {
        "ncclLLA2ACalcSlots" | "ncclTeamRankToWorld" | "ncclTeamRankToLsa" => Kind::Int,
        "ncclTeamWorld"
        | "ncclTeamLsa"
        | "ncclTeamCft"
        | "ncclTeamCftMultimem"
        | "ncclTeamRail" => Kind::Team,
        "ncclParamDumpAll" | "ncclResetDebugInit" | "ncclResetDebugInitInternal" => Kind::Void,
        _ => Kind::Result,
    }
}

/// True when forwarded function `name` takes no communicator, window or device
/// communicator, so that it may still reach the real library on strata's CPU device.
pub fn comm_free(name: &str) -> bool {
    name.starts_with("ncclParam")
        || matches!(
            name,
            "ncclResetDebugInit"
                | "ncclResetDebugInitInternal"
                | "ncclSetEncryption"
                | "ncclLLA2ACalcSlots"
                | "ncclLLA2ACreateRequirement"
                | "ncclGinOutboxCreateRequirement"
                | "ncclGinInboxA2ACreateRequirement"
                | "ncclLsaBarrierCreateRequirement"
        )
}

/// Why each slot that could not be forwarded could not (index = slot), set once by
/// [`resolve_all`].
static WHY: Mutex<Vec<Option<String>>> = Mutex::new(Vec::new());

/// The message of the last forwarded call that could not reach the real library.
static LAST_ERROR: Mutex<Option<String>> = Mutex::new(None);

/// The message of the last forwarded call that could not reach the real library
/// (returned `ncclInvalidUsage`, `-1`, the empty team, or did nothing), if any: for
/// `ncclGetLastError`.
pub fn last_error() -> Option<String> {
    LAST_ERROR.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Resolves every slot (module doc); runs once, later calls return at once.
extern "C" fn resolve_all() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let mut why = vec![None; N];
        let mut targets = [0usize; N];
        for (i, name) in FORWARDED.iter().enumerate() {
            targets[i] = match target(name) {
                Ok(addr) => addr,
                Err(msg) => {
                    why[i] = Some(msg);
                    stub(kind(name))
                }
            };
        }
        // The reasons first: a stub's first call (maybe on another thread, which sees the
        // slot before this closure returns) finds its message.
        *WHY.lock().unwrap_or_else(|e| e.into_inner()) = why;
        for (slot, target) in SLOTS.iter().zip(targets) {
            slot.store(target as *mut (), Ordering::Release);
        }
    });
}

/// Where forwarded function `name` goes: the real library's function, or why not.
fn target(name: &str) -> Result<usize, String> {
    let Some(real) = crate::real::real() else {
        let tried = crate::real::why_none().unwrap_or("nothing");
        return Err(format!(
            "{name} needs the real NCCL: no libnccl.so.2 found (tried {tried}); set STRATA_NCCL_REAL_LIB"
        ));
    };
    if crate::real::cpu_device() && !comm_free(name) {
        return Err(format!(
            "{name} needs the real NCCL's communicators: STRATA_NCCL_DEVICE=cpu runs them on strata's CPU device"
        ));
    }
    let ours = TRAMPOLINES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, f)| *f as usize);
    let found = [format!("p{name}\0"), format!("{name}\0")]
        .iter()
        .find_map(|sym| real.addr(sym.as_bytes()))
        .filter(|&a| Some(a) != ours);
    found.ok_or_else(|| {
        format!(
            "{name} needs a newer NCCL: the real library {} does not export it",
            real.path
        )
    })
}

/// The unavailable stub of a return kind.
fn stub(kind: Kind) -> usize {
    match kind {
        Kind::Result => unavailable_result as *const () as usize,
        Kind::Int => unavailable_int as *const () as usize,
        Kind::Team => unavailable_team as *const () as usize,
        Kind::Void => unavailable_void as *const () as usize,
    }
}

/// Records why the function of the slot at address `slot` is unavailable.
fn record(slot: usize) {
    let base = SLOTS.as_ptr() as usize;
    let i = slot.wrapping_sub(base) / std::mem::size_of::<AtomicPtr<()>>();
    let why = WHY.lock().unwrap_or_else(|e| e.into_inner());
    let msg = why.get(i).cloned().flatten().unwrap_or_else(|| {
        let name = FORWARDED
            .get(i)
            .copied()
            .unwrap_or("a forwarded NCCL function");
        format!("{name} could not reach the real NCCL")
    });
    drop(why);
    // ncclGetLastError(NULL) on this thread reads it.
    crate::errors::note(msg.clone());
    *LAST_ERROR.lock().unwrap_or_else(|e| e.into_inner()) = Some(msg);
}

/// NCCL's `ncclTeam_t`, as the `Team` stubs return it (12 bytes: `rax:rdx`, `x0:x1`).
#[repr(C)]
pub struct Team {
    pub n_ranks: i32,
    pub rank: i32,
    pub stride: i32,
}

extern "C" fn unavailable_result_rs(slot: usize) -> i32 {
    record(slot);
    5
}

extern "C" fn unavailable_int_rs(slot: usize) -> i32 {
    record(slot);
    -1
}

extern "C" fn unavailable_team_rs(slot: usize) -> Team {
    record(slot);
    Team {
        n_ranks: 0,
        rank: -1,
        stride: 0,
    }
}

extern "C" fn unavailable_void_rs(slot: usize) {
    record(slot);
}

macro_rules! unavailable_stubs {
    ($($stub:ident => $rs:ident),* $(,)?) => {
        $(
            /// Entered from a trampoline (x16 = the slot): names the function from its
            /// slot and returns what its kind returns when unavailable.
            #[cfg(target_arch = "aarch64")]
            #[unsafe(naked)]
            unsafe extern "C" fn $stub() {
                // SAFETY: a tail call with the slot address as the only argument (x0; the
                // forwarded call's own arguments are not read). `x30` still holds the
                // original caller's return address and `sp` is as the caller left it, so
                // the Rust function returns its value straight to the original caller in
                // the C ABI's registers, the same as the real function's return type.
                core::arch::naked_asm!("mov x0, x16", "b {f}", f = sym $rs)
            }

            /// Entered from a trampoline (r11 = the slot): names the function from its
            /// slot and returns what its kind returns when unavailable.
            #[cfg(target_arch = "x86_64")]
            #[unsafe(naked)]
            unsafe extern "C" fn $stub() {
                // SAFETY: a tail call with the slot address as the only argument (rdi;
                // the forwarded call's own arguments are not read). The stack is as the
                // original caller left it (rsp = 8 mod 16, a return address on top), which
                // is what a function entered by `call` expects, so the Rust function
                // returns its value straight to the original caller in the registers of
                // the C ABI, the same as the real function's return type.
                core::arch::naked_asm!("mov rdi, r11", "jmp {f}", f = sym $rs)
            }
        )*
    };
}

unavailable_stubs!(
    unavailable_result => unavailable_result_rs,
    unavailable_int => unavailable_int_rs,
    unavailable_team => unavailable_team_rs,
    unavailable_void => unavailable_void_rs,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trampolines_match_forwarded() {
        let mut a: Vec<&str> = TRAMPOLINES.iter().map(|(n, _)| *n).collect();
        let mut b: Vec<&str> = FORWARDED.to_vec();
        a.sort_unstable();
        b.sort_unstable();
        let n = b.len();
        b.dedup();
        assert_eq!(n, b.len(), "FORWARDED lists a name twice");
        assert_eq!(a, b);
        for (i, name) in FORWARDED.iter().enumerate() {
            assert_eq!(index_of(name), i);
        }
    }

    #[test]
    fn kinds() {
        assert_eq!(kind("ncclTeamWorld"), Kind::Team);
        assert_eq!(kind("ncclLLA2ACalcSlots"), Kind::Int);
        assert_eq!(kind("ncclParamDumpAll"), Kind::Void);
        assert_eq!(kind("ncclCommGrow"), Kind::Result);
        assert!(comm_free("ncclParamBind") && !comm_free("ncclCommGrow"));
        for name in FORWARDED {
            // The device-communicator team functions all take a communicator.
            assert!(kind(name) != Kind::Team || !comm_free(name));
        }
    }
}
