//! The books as one JSON document: the single serialisation path behind snapshots (stored in the
//! safetensors `__metadata__`) and pickling. Decoding rebuilds the books through the same
//! invariants as live operation and fails with `SnapshotCorrupt` on any inconsistency.

use serde::{Deserialize, Serialize};

use crate::books::{Books, Counters};
use crate::error::{corrupt, Result};

#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct TenantState {
    name: String,
    quota: Option<u64>,
    hits: u64,
    allocations: u64,
    evictions: u64,
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct BooksState {
    capacity: u64,
    auto_create: bool,
    /// Creation order.
    tenants: Vec<TenantState>,
    /// Used slots, least recently used first (the global LRU list).
    recency: Vec<u32>,
    /// `owners[i]`: index into `tenants` of the owner of `recency[i]`.
    owners: Vec<u32>,
    /// Free slots in stack order (the last is handed out next).
    free: Vec<u32>,
}

pub fn encode_books(books: &Books) -> String {
    let recency = books.recency(None).expect("global recency needs no tenant");
    let state = BooksState {
        capacity: books.capacity().into(),
        auto_create: books.auto_create(),
        tenants: books
            .tenant_records()
            .iter()
            .map(|t| TenantState {
                name: t.name.clone(),
                quota: t.quota.map(u64::from),
                hits: t.counters.hits,
                allocations: t.counters.allocations,
                evictions: t.counters.evictions,
            })
            .collect(),
        owners: recency.iter().map(|&s| books.owner_index(s)).collect(),
        recency,
        free: books.free_slots().to_vec(),
    };
    serde_json::to_string(&state).expect("books state is always serialisable")
}

/// Rebuilds books from `encode_books` output, refusing anything inconsistent.
pub fn decode_books(json: &str) -> Result<Books> {
    decode_books_checked(json, None)
}

/// As `decode_books`, also requiring `capacity` when given (a snapshot's array layout). The
/// capacity is checked against the listed slots before anything of that size is allocated, so a
/// crafted document cannot make the decoder allocate more than its own length suggests.
pub fn decode_books_checked(json: &str, capacity: Option<u64>) -> Result<Books> {
    let state: BooksState =
        serde_json::from_str(json).map_err(|e| corrupt(format!("books metadata: {e}")))?;
    let books_err = |msg: String| corrupt(format!("books metadata: {msg}"));
    if let Some(expected) = capacity {
        if state.capacity != expected {
            return Err(books_err(format!(
                "capacity {} disagrees with the arrays' {expected} slots",
                state.capacity
            )));
        }
    }
    if (state.recency.len() + state.free.len()) as u64 != state.capacity {
        return Err(books_err(
            "recency and free list do not cover the capacity exactly".into(),
        ));
    }
    // Declared tenants (quotas checked against the capacity as in live operation).
    let declared: Vec<(String, Option<u64>)> = state
        .tenants
        .iter()
        .map(|t| (t.name.clone(), t.quota))
        .collect();
    let mut books =
        Books::new(state.capacity, Some(&declared)).map_err(|e| books_err(e.to_string()))?;
    books.set_auto_create(state.auto_create);
    if state.owners.len() != state.recency.len() {
        return Err(books_err("recency and owners differ in length".into()));
    }
    for (&slot, &t) in state.recency.iter().zip(&state.owners) {
        books.restore_used(slot, t).map_err(books_err)?;
    }
    books.restore_free(state.free).map_err(books_err)?;
    for (t, ts) in state.tenants.iter().enumerate() {
        let counters = Counters {
            hits: ts.hits,
            allocations: ts.allocations,
            evictions: ts.evictions,
        };
        books.restore_counters(t, counters).map_err(books_err)?;
    }
    Ok(books)
}
