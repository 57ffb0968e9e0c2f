//! `mpi`: ranks are the processes of an MPI job (rsmpi over the system MPI; host memory).
//!
//! - One MPI communicator per transport: the world transport owns a duplicate of
//!   `MPI_COMM_WORLD`, [`Transport::split`](super::Transport::split) makes children with `MPI_Comm_split`, so the
//!   messages of different strata communicators never meet. Every communicator has
//!   `MPI_ERRORS_RETURN`, so MPI failures become [`Error::System`](crate::error::Error::System) rather than aborts.
//! - MPI is initialised once per process with `MPI_THREAD_MULTIPLE` (the stream threads
//!   of several communicators call MPI at once) and finalised by [`finalize`]. When the
//!   host program initialised MPI itself, strata uses it (if it is multi-threaded) and
//!   leaves finalisation to the host.
//! - Point-to-point: bytes (`MPI_UINT8_T`), nonblocking requests polled
//!   with `MPI_Test` until done, so no wait outlives [`Transport::timeout`](super::Transport::timeout) without
//!   progress (the deadline restarts whenever a piece completes). `sendrecv` keeps its
//!   send and receive in flight together, so the ring (every rank sending to `next` and
//!   receiving from `prev` at once) cannot deadlock.
//! - Every message between two ranks of a communicator is numbered in order, and its tag
//!   carries that sequence number and its class (small, whole, length header, piece),
//!   so a receive posted for a tag matches exactly the one message it expects.
//! - A small message (up to 64 KiB, at most a piece) has its receive posted before the
//!   peer's message comes (in `sendrecv` before the send), into a reused 64 KiB landing
//!   buffer that holds any small message whole: the length comes from the status, the
//!   bytes are copied out. A `sendrecv` of two small messages (a latency-bound step)
//!   posts and polls its two requests itself for the spin's polls, and hands them to
//!   the driver (`progress`) only when they are not done by then.
//!   Were the peer's message of our number longer (another class), it shows up unmatched
//!   (`MPI_Iprobe` while waiting): the receive is withdrawn and that message drained.
//!   A larger receive first matches the incoming message (`MPI_Improbe`) and compares its
//!   length (a truncating receive is not safe: OpenMPI's single-copy path ignores the
//!   receive count). A mismatch is [`Error::InvalidUsage`](crate::error::Error::InvalidUsage) (the message is consumed and
//!   dropped), worded as the local transport words it.
//! - Messages longer than the piece limit (256 KiB; the hidden knob
//!   `STRATA_MPI_MAX_MESSAGE` sets it, the same on every rank) travel as an 8-byte length
//!   header followed by pieces; shorter ones as one message. Counts therefore always fit
//!   MPI's `int`. A `sendrecv`'s pieces go as synchronous sends (`MPI_Issend`, complete
//!   once the peer matched them), at most two unmatched at a time, so the two
//!   directions of an exchange move in step and no more than two pieces wait in
//!   queues: posted all at once, one direction of a shaped TCP link ran ahead of the
//!   other and the exchange waited for the slow one (docs/cluster.md, "One link").
//!   Plain sends and `exchange` post every piece at once. The hidden knob
//!   `STRATA_MPI_SEND_WINDOW` sets the window (0: none, every piece at once).
//! - MPI never writes the caller's receive buffer: every message lands in memory of the
//!   transport (a small one in its landing buffer, a larger one piece by piece in two
//!   staging buffers of a piece each, so one piece is in flight while the other is
//!   copied into the caller's buffer), kept per communicator between calls (at most two
//!   pieces per receive in flight). The cost is that copy: one more pass over the
//!   received bytes, read from cache.
//! - Waiting polls with `MPI_Test`: spinning briefly (unless the host runs more ranks than
//!   it has cores), then yielding (while a transfer is posted, every 32 polls: MPI's
//!   progress moves its fragments), then, while only waiting for a message to arrive,
//!   sleeping in growing steps.
//! - Native collectives are the ring defaults of [`crate::transport::ring`] over these
//!   calls, so the traffic recorded here (every `send`, world rank to world rank) is the
//!   nominal ring traffic: MPI may route the bytes differently underneath.
//! - A timeout or an abort cancels pending requests (best effort). When a request
//!   cannot be retired within a short grace period (OpenMPI cannot cancel a send, nor a
//!   receive already matched) it is released to MPI and the communicator is marked
//!   broken: every later call fails, as after ncclCommAbort. A receive's request takes
//!   its landing or staging memory with it (leaked), so once a call returned, with an
//!   error or not, MPI never writes its receive buffer. A send is not copied: a send
//!   released to MPI may still read the caller's buffer until the peer takes the message
//!   (never writes it), so after such an error keep send buffers alive or end the job.
//!   A timeout while waiting for a message to arrive leaves nothing in flight and the
//!   communicator usable, unless a `sendrecv`'s synchronous pieces are still unmatched
//!   by the stalled peer: those cannot be cancelled, and the communicator is broken.
//!
//! Modules: `init` (initialisation, finalize, peer failures), `comm` (communicator
//! handles, MPI error codes), `control` (the control communicator: member-only
//! creations and the census, apart from the data messages), `tags` (message classes, tags, sequence numbers),
//! `request` (the request wrapper, retire and cancel), `send` and `recv` (one transfer's
//! state machine each), `progress` (driving transfers, backoff, timeouts), `transport`
//! ([`MpiTransport`]); `stub` stands in for all of them in a build without MPI; `tests`
//! drive the receive state machine over real MPI (see there for the commands).

#[cfg(feature = "mpi")]
mod comm;
#[cfg(feature = "mpi")]
mod control;
#[cfg(feature = "mpi")]
mod init;
#[cfg(feature = "mpi")]
mod progress;
#[cfg(feature = "mpi")]
mod rc;
#[cfg(feature = "mpi")]
mod recv;
#[cfg(feature = "mpi")]
mod request;
#[cfg(feature = "mpi")]
mod send;
#[cfg(feature = "mpi")]
mod tags;
#[cfg(all(test, feature = "mpi"))]
mod tests;
#[cfg(feature = "mpi")]
mod transport;

#[cfg(feature = "mpi")]
pub use init::{finalize, peer_failure};
#[cfg(feature = "mpi")]
pub use transport::MpiTransport;

#[cfg(not(feature = "mpi"))]
mod stub;
#[cfg(not(feature = "mpi"))]
pub use stub::{finalize, peer_failure, MpiTransport};
