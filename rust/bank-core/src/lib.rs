//! drift-bank-core: the host-side books of a DRIFT bank, with no Python types.
//!
//! - [`Books`]: slots, per-tenant / pool / global LRU lists, free stack, counters.
//! - [`kernels`]: DRIFT's CPU arithmetic (retrieval + bias add, update, allocation) on slices.
//! - [`cpu_bank`]: a CPU bank's state and calls: strided rows, recorded retrievals, draft step
//!   and update (the bank's extent is its books', [`Books::extent`]).
//! - [`skinny`]: y = x·Wᵀ for few rows (1..16) at one read of W, threaded over W's rows.
//! - [`layer`]: a Llama layer's RMSNorm and SiLU fused with its skinny linears.
//! - [`state`]: the books as JSON, the one serialisation path for snapshots and pickling.
//! - [`snapshot`]: safetensors snapshot files with the bank's arrays, checked on load.

pub mod books;
pub mod cpu_bank;
pub mod error;
pub mod kernels;
pub mod layer;
mod lru;
pub mod skinny;
pub mod snapshot;
pub mod state;

pub use books::{Allocation, Books, Counters, Stats, MAX_CAPACITY};
pub use error::{BankError, Result};
pub use snapshot::{ArrayRef, ElementType, Layout, LoadedArray, Snapshot, FORMAT_VERSION};
