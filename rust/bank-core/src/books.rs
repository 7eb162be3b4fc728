//! The books of one DRIFT bank: which slots hold a prototype, who owns them, in what order they
//! were last used, and the hit / allocation / eviction counters.
//!
//! Tenants. A tenant with a quota reserves that many slots: it never holds more, and when full it
//! evicts its own least recently used slot. Tenants without a quota share the rest of the capacity
//! (the *pool*, `capacity - Σ quotas`) and evict the pool's least recently used slot, whichever
//! pool tenant owns it. Books built without quotas create tenants on first use, so by default
//! every tenant is a pool tenant and eviction is one global LRU.
//!
//! Free slots are a stack: a fresh bank hands out 0, 1, 2, ...; a released slot is reused first.
//!
//! Layout: one record per slot (link, owner, use stamp) in a single array, so a touched slot is one
//! cache line. Each used slot sits in exactly one *eviction group* list: its tenant's list for a
//! quota tenant, the pool list otherwise, so a touch moves one list entry. The global order is
//! the use stamp (a counter bumped on every allocation and every touched entry).
//!
//! `allocate`, `release`, `is_valid`, `owner`, `stats` are O(1); `touch` is O(batch); the
//! listing queries are O(N) (`recency(None)` O(N log N): a sort by stamp), meant for reports,
//! tests and snapshots, not for the decoding loop.

use std::collections::HashMap;

use crate::error::{BankError, Result};
use crate::lru::{self, Link, List, NIL};

/// Largest supported capacity: 2^26 slots (1.5 GiB of records). A bank that size would need
/// 2^26 · d key elements on the device, far past any GPU; the cap turns a mistyped capacity into
/// a clear error instead of an out-of-memory kill. (Slot ids are u32; `u32::MAX` marks "none".)
pub const MAX_CAPACITY: u64 = 1 << 26;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Slot uses reported through `touch` (each entry of each batch).
    pub hits: u64,
    /// Slots handed out by `allocate` (fresh or evicted).
    pub allocations: u64,
    /// Slots taken away by eviction (for a tenant: its own slots lost to eviction).
    pub evictions: u64,
}

impl Counters {
    fn checked_add(&self, other: &Counters) -> Option<Counters> {
        Some(Counters {
            hits: self.hits.checked_add(other.hits)?,
            allocations: self.allocations.checked_add(other.allocations)?,
            evictions: self.evictions.checked_add(other.evictions)?,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stats {
    pub counters: Counters,
    pub used: u64,
    /// Slots this scope may hold: the bank's capacity, a tenant's quota, or the pool's size.
    pub capacity: u64,
}

/// What `allocate` did: the slot now owned by the tenant, and the index (see
/// `Books::tenant_name`) of the tenant it was evicted from, if it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub slot: u32,
    pub evicted_from: Option<u32>,
}

#[derive(Clone, Debug)]
pub(crate) struct Tenant {
    pub name: String,
    pub quota: Option<u32>,
    pub counters: Counters,
    pub used: u32,
    pub list: List, // a quota tenant's slots in LRU order (unused for pool tenants)
}

/// One slot: its place in its eviction group's list, its owner and its last use.
#[derive(Clone, Copy, Debug)]
struct SlotRecord {
    link: Link,
    owner: u32, // tenant index, NIL when free
    stamp: u64, // clock value of the last allocation or touch
}

impl AsRef<Link> for SlotRecord {
    fn as_ref(&self) -> &Link {
        &self.link
    }
}

impl AsMut<Link> for SlotRecord {
    fn as_mut(&mut self) -> &mut Link {
        &mut self.link
    }
}

#[derive(Clone, Debug)]
pub struct Books {
    capacity: u32,
    auto_create: bool,
    tenants: Vec<Tenant>,
    by_name: HashMap<String, u32>,
    reserved: u32,          // Σ quotas
    slots: Vec<SlotRecord>, // [N]
    free: Vec<u32>,         // stack of free slots; the last entry is handed out next
    pool: List,             // LRU list of the slots of tenants without quota
    used: u32,
    high: u32, // 1 + the highest slot ever attached (0 when none was)
    clock: u64,
    counters: Counters,
}

impl Books {
    /// `quotas`: None for tenants created on first use sharing the capacity; Some for tenants
    /// declared up front (more may be added with `add_tenant`), unknown names being refused.
    pub fn new(capacity: u64, quotas: Option<&[(String, Option<u64>)]>) -> Result<Books> {
        if capacity == 0 || capacity > MAX_CAPACITY {
            return Err(BankError::Quota(format!(
                "bank capacity must be between 1 and {MAX_CAPACITY}, got {capacity}"
            )));
        }
        let n = capacity as usize;
        // try_reserve: an absurd capacity is an error, not an allocation abort.
        let mut slots = Vec::new();
        let mut free = Vec::new();
        if slots.try_reserve_exact(n).is_err() || free.try_reserve_exact(n).is_err() {
            return Err(BankError::Quota(format!(
                "cannot allocate books for capacity {capacity}"
            )));
        }
        slots.resize(
            n,
            SlotRecord {
                link: Link::NONE,
                owner: NIL,
                stamp: 0,
            },
        );
        free.extend((0..capacity as u32).rev());
        let mut books = Books {
            capacity: capacity as u32,
            auto_create: quotas.is_none(),
            tenants: Vec::new(),
            by_name: HashMap::new(),
            reserved: 0,
            slots,
            free,
            pool: List::EMPTY,
            used: 0,
            high: 0,
            clock: 0,
            counters: Counters::default(),
        };
        for (name, quota) in quotas.unwrap_or(&[]) {
            books.add_tenant(name, *quota)?;
        }
        Ok(books)
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    pub fn auto_create(&self) -> bool {
        self.auto_create
    }

    /// Used slots.
    pub fn len(&self) -> u32 {
        self.used
    }

    /// The bank's extent, (hi, n_valid): 1 + the highest slot handed out since the books were
    /// made or loaded (fresh books hand out 0, 1, 2, ...: while a bank fills, slots [hi, N) are
    /// all free, so retrieval scans [0, hi) only), and the number of used slots. The books are
    /// the extent's one owner; a bank reads it from here.
    pub fn extent(&self) -> (u32, u32) {
        (self.high, self.used)
    }

    pub fn is_empty(&self) -> bool {
        self.used == 0
    }

    /// The name of tenant index `t` (as in `Allocation::evicted_from`).
    pub fn tenant_name(&self, t: u32) -> &str {
        &self.tenants[t as usize].name
    }

    /// Slots left to tenants without quota.
    pub fn pool_capacity(&self) -> u32 {
        self.capacity - self.reserved
    }

    pub fn add_tenant(&mut self, name: &str, quota: Option<u64>) -> Result<()> {
        if name.is_empty() {
            return Err(BankError::Tenant("tenant name must not be empty".into()));
        }
        if self.by_name.contains_key(name) {
            return Err(BankError::Tenant(format!("tenant {name:?} already exists")));
        }
        if let Some(q) = quota {
            let room = u64::from(self.pool_capacity() - self.pool.len);
            if q > room {
                return Err(BankError::Quota(format!(
                    "quota {q} for tenant {name:?} exceeds the {room} unreserved free slots \
                     (capacity {}, reserved {}, pool tenants hold {})",
                    self.capacity, self.reserved, self.pool.len
                )));
            }
            self.reserved += q as u32;
        }
        let index = self.tenants.len() as u32;
        self.tenants.push(Tenant {
            name: name.to_owned(),
            quota: quota.map(|q| q as u32),
            counters: Counters::default(),
            used: 0,
            list: List::EMPTY,
        });
        self.by_name.insert(name.to_owned(), index);
        Ok(())
    }

    /// A free slot for `tenant`, else the least recently used slot it may evict.
    pub fn allocate(&mut self, tenant: &str) -> Result<Allocation> {
        let t = self.tenant_for_allocation(tenant)?;
        let victim = self.victim(t)?;
        let evicted_from = match victim {
            Some(slot) => {
                let loser = self.slots[slot as usize].owner;
                self.detach(slot);
                self.tenants[loser as usize].counters.evictions += 1;
                self.counters.evictions += 1;
                Some(loser)
            }
            None => None,
        };
        let slot = match victim {
            Some(slot) => slot,
            // The quota arithmetic guarantees a free slot here (see `victim`).
            None => self.free.pop().ok_or_else(|| {
                BankError::Quota("no free slot although the quotas promise one".into())
            })?,
        };
        self.attach(slot, t);
        self.tenants[t as usize].counters.allocations += 1;
        self.counters.allocations += 1;
        Ok(Allocation { slot, evicted_from })
    }

    /// `count` allocations for one tenant in one call (what one DRIFT update needs). If the
    /// first fails nothing changes; once one succeeds the rest cannot fail.
    pub fn allocate_many(&mut self, tenant: &str, count: usize) -> Result<Vec<Allocation>> {
        (0..count).map(|_| self.allocate(tenant)).collect()
    }

    /// Marks `slots` used, in order (the last is the most recent); one hit per entry.
    /// Checks the whole batch first, so an invalid entry changes nothing.
    pub fn touch(&mut self, slots: &[u32]) -> Result<()> {
        for &slot in slots {
            self.check_used(slot)?;
        }
        for &slot in slots {
            self.clock += 1;
            let record = &mut self.slots[slot as usize];
            record.stamp = self.clock;
            let tenant = &mut self.tenants[record.owner as usize];
            tenant.counters.hits += 1;
            let group = if tenant.quota.is_some() {
                &mut tenant.list
            } else {
                &mut self.pool
            };
            lru::move_to_mru(&mut self.slots, group, slot);
        }
        self.counters.hits += slots.len() as u64;
        Ok(())
    }

    pub fn release(&mut self, slot: u32) -> Result<()> {
        self.check_used(slot)?;
        self.detach(slot);
        self.free.push(slot);
        Ok(())
    }

    /// Used slots, least recently used first: all of them (sorted by use stamp), or one
    /// tenant's (its own list, or the pool list filtered to it).
    pub fn recency(&self, tenant: Option<&str>) -> Result<Vec<u32>> {
        Ok(match tenant {
            None => {
                let mut used = self.valid_slots(None)?;
                used.sort_unstable_by_key(|&s| self.slots[s as usize].stamp);
                used
            }
            Some(name) => {
                let t = self.tenant_index(name)?;
                let tenant = &self.tenants[t as usize];
                match tenant.quota {
                    Some(_) => lru::iter(&self.slots, &tenant.list).collect(),
                    None => lru::iter(&self.slots, &self.pool)
                        .filter(|&s| self.slots[s as usize].owner == t)
                        .collect(),
                }
            }
        })
    }

    /// Used slots in ascending order: all of them, or one tenant's.
    pub fn valid_slots(&self, tenant: Option<&str>) -> Result<Vec<u32>> {
        match tenant {
            None => Ok((0..self.capacity)
                .filter(|&s| self.slots[s as usize].owner != NIL)
                .collect()),
            Some(_) => {
                let mut slots = self.recency(tenant)?;
                slots.sort_unstable();
                Ok(slots)
            }
        }
    }

    pub fn is_valid(&self, slot: u32) -> Result<bool> {
        self.check_range(slot)?;
        Ok(self.slots[slot as usize].owner != NIL)
    }

    pub fn owner(&self, slot: u32) -> Result<Option<&str>> {
        self.check_range(slot)?;
        Ok(match self.slots[slot as usize].owner {
            NIL => None,
            t => Some(self.tenants[t as usize].name.as_str()),
        })
    }

    /// (name, quota) in creation order.
    pub fn tenants(&self) -> Vec<(&str, Option<u32>)> {
        self.tenants
            .iter()
            .map(|t| (t.name.as_str(), t.quota))
            .collect()
    }

    pub fn stats(&self, tenant: Option<&str>) -> Result<Stats> {
        Ok(match tenant {
            None => Stats {
                counters: self.counters,
                used: self.used.into(),
                capacity: self.capacity.into(),
            },
            Some(name) => {
                let t = &self.tenants[self.tenant_index(name)? as usize];
                Stats {
                    counters: t.counters,
                    used: t.used.into(),
                    capacity: t.quota.unwrap_or(self.pool_capacity()).into(),
                }
            }
        })
    }

    /// Free slots in stack order (the last is handed out next).
    pub fn free_slots(&self) -> &[u32] {
        &self.free
    }

    pub(crate) fn tenant_records(&self) -> &[Tenant] {
        &self.tenants
    }

    pub(crate) fn owner_index(&self, slot: u32) -> u32 {
        self.slots[slot as usize].owner
    }

    // ---- restoring from a serialised state (see `state.rs`) ----

    /// Gives `slot` (free, not yet on the free stack) to tenant index `t` as its most recent slot.
    pub(crate) fn restore_used(&mut self, slot: u32, t: u32) -> std::result::Result<(), String> {
        if slot >= self.capacity || self.slots[slot as usize].owner != NIL {
            return Err(format!(
                "slot {slot} out of range or listed twice in the recency order"
            ));
        }
        if t as usize >= self.tenants.len() {
            return Err(format!(
                "slot {slot} owned by tenant #{t}, which does not exist"
            ));
        }
        let tenant = &self.tenants[t as usize];
        let full = match tenant.quota {
            Some(q) => tenant.used >= q,
            None => self.pool.len >= self.pool_capacity(),
        };
        if full {
            return Err(format!(
                "tenant {:?} holds more slots than it may",
                tenant.name
            ));
        }
        self.attach(slot, t);
        Ok(())
    }

    /// Replaces the free stack; it must list exactly the slots that are not used.
    pub(crate) fn restore_free(&mut self, free: Vec<u32>) -> std::result::Result<(), String> {
        let mut seen = vec![false; self.capacity as usize];
        for &s in &free {
            if s >= self.capacity || self.slots[s as usize].owner != NIL || seen[s as usize] {
                return Err(format!(
                    "free list entry {s} is out of range, used, or repeated"
                ));
            }
            seen[s as usize] = true;
        }
        if free.len() as u32 + self.used != self.capacity {
            return Err("free list and recency order do not cover every slot".into());
        }
        self.free = free;
        Ok(())
    }

    pub(crate) fn set_auto_create(&mut self, auto_create: bool) {
        self.auto_create = auto_create;
    }

    pub(crate) fn restore_counters(
        &mut self,
        t: usize,
        counters: Counters,
    ) -> std::result::Result<(), String> {
        self.tenants[t].counters = counters;
        self.counters = self
            .counters
            .checked_add(&counters)
            .ok_or("counters overflow")?;
        Ok(())
    }

    // ---- internals ----

    fn tenant_index(&self, name: &str) -> Result<u32> {
        self.by_name
            .get(name)
            .copied()
            .ok_or_else(|| BankError::UnknownTenant(name.to_owned()))
    }

    fn tenant_for_allocation(&mut self, name: &str) -> Result<u32> {
        if let Some(&t) = self.by_name.get(name) {
            return Ok(t);
        }
        if !self.auto_create {
            return Err(BankError::UnknownTenant(name.to_owned()));
        }
        if self.pool_capacity() == 0 {
            return Err(BankError::Quota(format!(
                "cannot create tenant {name:?}: quotas reserve the whole capacity"
            )));
        }
        self.add_tenant(name, None)?;
        Ok(self.tenants.len() as u32 - 1)
    }

    /// The slot tenant `t` must evict, or None when it may take a free slot. A free slot exists
    /// whenever None is returned: free = N - Σ used ≥ (quota_t - used_t) for a quota tenant below
    /// its quota, and ≥ (pool capacity - pool used) for a pool tenant, both > 0.
    fn victim(&self, t: u32) -> Result<Option<u32>> {
        let tenant = &self.tenants[t as usize];
        let (used, limit, lru) = match tenant.quota {
            Some(q) => (tenant.used, q, tenant.list.head),
            None => (self.pool.len, self.pool_capacity(), self.pool.head),
        };
        if used < limit {
            Ok(None)
        } else if limit == 0 {
            Err(BankError::Quota(match tenant.quota {
                Some(_) => format!("tenant {:?} has quota 0", tenant.name),
                None => format!(
                    "tenant {:?} has no quota and quotas reserve the whole capacity",
                    tenant.name
                ),
            }))
        } else {
            Ok(Some(lru))
        }
    }

    /// Gives free `slot` to tenant `t` as the most recently used slot of its eviction group.
    fn attach(&mut self, slot: u32, t: u32) {
        self.clock += 1;
        let record = &mut self.slots[slot as usize];
        record.owner = t;
        record.stamp = self.clock;
        let tenant = &mut self.tenants[t as usize];
        tenant.used += 1;
        let group = if tenant.quota.is_some() {
            &mut tenant.list
        } else {
            &mut self.pool
        };
        lru::push_mru(&mut self.slots, group, slot);
        self.used += 1;
        self.high = self.high.max(slot + 1);
    }

    /// Takes used `slot` away from its owner (it is then neither used nor on the free stack).
    fn detach(&mut self, slot: u32) {
        let record = &mut self.slots[slot as usize];
        let t = record.owner;
        record.owner = NIL;
        let tenant = &mut self.tenants[t as usize];
        tenant.used -= 1;
        let group = if tenant.quota.is_some() {
            &mut tenant.list
        } else {
            &mut self.pool
        };
        lru::unlink(&mut self.slots, group, slot);
        self.used -= 1;
    }

    fn check_range(&self, slot: u32) -> Result<()> {
        if slot >= self.capacity {
            return Err(BankError::Slot(format!(
                "slot {slot} is out of range for a bank of capacity {}",
                self.capacity
            )));
        }
        Ok(())
    }

    fn check_used(&self, slot: u32) -> Result<()> {
        self.check_range(slot)?;
        if self.slots[slot as usize].owner == NIL {
            return Err(BankError::Slot(format!("slot {slot} is free")));
        }
        Ok(())
    }
}
