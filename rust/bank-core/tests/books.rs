//! Books: allocation, LRU eviction, batched touch, release, tenants and quotas, state round trip.

use drift_bank_core::state::{decode_books, encode_books};
use drift_bank_core::{BankError, Books};

fn shared(n: u64) -> Books {
    Books::new(n, None).unwrap()
}

fn quotas(n: u64, q: &[(&str, Option<u64>)]) -> Books {
    let q: Vec<(String, Option<u64>)> = q.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    Books::new(n, Some(&q)).unwrap()
}

fn alloc(b: &mut Books, t: &str) -> (u32, Option<String>) {
    let a = b.allocate(t).unwrap();
    (a.slot, a.evicted_from.map(|i| b.tenant_name(i).to_owned()))
}

#[test]
fn fresh_slots_come_in_order_then_the_lru_is_evicted() {
    let mut b = shared(3);
    assert_eq!(alloc(&mut b, "a"), (0, None));
    assert_eq!(alloc(&mut b, "a"), (1, None));
    assert_eq!(alloc(&mut b, "b"), (2, None));
    b.touch(&[0]).unwrap();
    // LRU order is now 1, 2, 0: slot 1 goes first, and it belonged to "a".
    assert_eq!(alloc(&mut b, "b"), (1, Some("a".into())));
    assert_eq!(b.recency(None).unwrap(), vec![2, 0, 1]);
    assert_eq!(b.recency(Some("b")).unwrap(), vec![2, 1]);
    assert_eq!(b.owner(1).unwrap(), Some("b"));
    let s = b.stats(None).unwrap();
    assert_eq!(
        (
            s.counters.hits,
            s.counters.allocations,
            s.counters.evictions,
            s.used
        ),
        (1, 4, 1, 3)
    );
    let a = b.stats(Some("a")).unwrap();
    assert_eq!(
        (a.counters.allocations, a.counters.evictions, a.used),
        (2, 1, 1)
    );
}

#[test]
fn allocate_many_is_allocate_in_a_loop() {
    let (mut a, mut b) = (shared(3), shared(3));
    b.touch(&[]).unwrap();
    let many = a.allocate_many("t", 5).unwrap();
    let one: Vec<_> = (0..5).map(|_| b.allocate("t").unwrap()).collect();
    assert_eq!(many, one);
    assert_eq!(
        many.iter().map(|x| x.slot).collect::<Vec<_>>(),
        vec![0, 1, 2, 0, 1]
    );
    let mut q = quotas(3, &[("z", Some(0))]);
    assert!(matches!(q.allocate_many("z", 2), Err(BankError::Quota(_))));
    assert_eq!(q.len(), 0);
}

#[test]
fn touch_is_ordered_counts_duplicates_and_is_all_or_nothing() {
    let mut b = shared(4);
    for _ in 0..4 {
        b.allocate("default").unwrap();
    }
    b.touch(&[2, 0, 2]).unwrap();
    assert_eq!(b.recency(None).unwrap(), vec![1, 3, 0, 2]);
    assert_eq!(b.stats(None).unwrap().counters.hits, 3);
    b.release(3).unwrap();
    let err = b.touch(&[1, 3]).unwrap_err();
    assert!(
        matches!(err, BankError::Slot(ref m) if m == "slot 3 is free"),
        "{err}"
    );
    let err = b.touch(&[1, 4]).unwrap_err();
    assert!(matches!(err, BankError::Slot(_)));
    assert_eq!(
        b.recency(None).unwrap(),
        vec![1, 0, 2],
        "a failed batch changes nothing"
    );
    assert_eq!(b.stats(None).unwrap().counters.hits, 3);
}

#[test]
fn released_slots_are_reused_first_and_double_release_fails() {
    let mut b = shared(4);
    for _ in 0..3 {
        b.allocate("default").unwrap();
    }
    b.release(1).unwrap();
    assert!(!b.is_valid(1).unwrap());
    assert!(matches!(b.release(1), Err(BankError::Slot(_))));
    assert!(matches!(b.is_valid(4), Err(BankError::Slot(_))));
    assert_eq!(alloc(&mut b, "default"), (1, None));
    assert_eq!(alloc(&mut b, "default"), (3, None));
    assert_eq!(b.valid_slots(None).unwrap(), vec![0, 1, 2, 3]);
    assert_eq!(b.len(), 4);
}

#[test]
fn quota_tenants_evict_only_their_own_slots() {
    let mut b = quotas(5, &[("x", Some(2)), ("y", Some(3))]);
    assert_eq!(alloc(&mut b, "x"), (0, None));
    assert_eq!(alloc(&mut b, "y"), (1, None));
    assert_eq!(alloc(&mut b, "x"), (2, None));
    // x is full: its own LRU (0) goes, although y's slot 1 is older.
    assert_eq!(alloc(&mut b, "x"), (0, Some("x".into())));
    assert_eq!(b.recency(Some("x")).unwrap(), vec![2, 0]);
    assert_eq!(alloc(&mut b, "y"), (3, None));
    assert_eq!(alloc(&mut b, "y"), (4, None));
    assert_eq!(alloc(&mut b, "y"), (1, Some("y".into())));
    assert!(matches!(b.allocate("z"), Err(BankError::UnknownTenant(ref n)) if n == "z"));
    assert_eq!(b.stats(Some("x")).unwrap().capacity, 2);
}

#[test]
fn quotas_are_checked_against_the_capacity() {
    let q = vec![("a".to_string(), Some(3)), ("b".to_string(), Some(3))];
    assert!(matches!(Books::new(5, Some(&q)), Err(BankError::Quota(_))));
    assert!(matches!(Books::new(0, None), Err(BankError::Quota(_))));
    let mut b = quotas(4, &[("a", Some(0))]);
    assert!(matches!(b.allocate("a"), Err(BankError::Quota(_))));
    assert!(matches!(b.add_tenant("a", None), Err(BankError::Tenant(_))));
    assert!(matches!(b.add_tenant("", None), Err(BankError::Tenant(_))));
}

#[test]
fn pool_tenants_share_what_quotas_leave() {
    let mut b = quotas(4, &[("q", Some(2)), ("p1", None), ("p2", None)]);
    assert_eq!(b.pool_capacity(), 2);
    assert_eq!(alloc(&mut b, "p1"), (0, None));
    assert_eq!(alloc(&mut b, "p2"), (1, None));
    // The pool is full: the pool's LRU (p1's slot 0) goes, never q's reserved room.
    assert_eq!(alloc(&mut b, "p2"), (0, Some("p1".into())));
    assert_eq!(alloc(&mut b, "q"), (2, None));
    assert_eq!(alloc(&mut b, "q"), (3, None));
    assert_eq!(b.stats(Some("p1")).unwrap().capacity, 2);
    // A new quota may not take slots the pool tenants already hold.
    assert!(matches!(
        b.add_tenant("r", Some(1)),
        Err(BankError::Quota(_))
    ));
    b.release(1).unwrap();
    b.add_tenant("r", Some(1)).unwrap();
    assert_eq!(b.pool_capacity(), 1);
    assert_eq!(alloc(&mut b, "r"), (1, None));
}

#[test]
fn shared_books_refuse_new_tenants_when_quotas_take_everything() {
    let mut b = shared(2);
    b.add_tenant("big", Some(2)).unwrap();
    assert!(matches!(b.allocate("new"), Err(BankError::Quota(_))));
    assert!(
        b.tenants().iter().all(|(n, _)| *n != "new"),
        "no half-created tenant"
    );
}

fn busy_books() -> Books {
    let mut b = quotas(6, &[("q", Some(2)), ("p", None)]);
    for t in ["q", "p", "q", "p", "q", "p", "p", "p"] {
        b.allocate(t).unwrap();
    }
    b.touch(&[1, 0]).unwrap();
    b.release(3).unwrap();
    b.add_tenant("late", None).unwrap();
    b
}

#[test]
fn state_round_trips_and_the_copy_behaves_identically() {
    let mut a = busy_books();
    let json = encode_books(&a);
    let mut b = decode_books(&json).unwrap();
    assert_eq!(encode_books(&b), json);
    for t in ["late", "p", "q", "p", "late"] {
        assert_eq!(a.allocate(t).unwrap(), b.allocate(t).unwrap());
    }
    assert_eq!(a.recency(None).unwrap(), b.recency(None).unwrap());
    assert_eq!(a.stats(None).unwrap(), b.stats(None).unwrap());
    assert_eq!(a.stats(Some("p")).unwrap(), b.stats(Some("p")).unwrap());
}

#[test]
fn inconsistent_states_are_refused() {
    let json = encode_books(&busy_books());
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    type Mutation = Box<dyn Fn(&mut serde_json::Value)>;
    let mutations: Vec<(&str, Mutation)> = vec![
        (
            "duplicate recency",
            Box::new(|v| v["recency"][1] = v["recency"][0].clone()),
        ),
        (
            "free list short",
            Box::new(|v| {
                v["free"].as_array_mut().unwrap().pop();
            }),
        ),
        (
            "free list has a used slot",
            Box::new(|v| v["free"][0] = v["recency"][0].clone()),
        ),
        (
            "owner out of range",
            Box::new(|v| v["owners"][0] = 9.into()),
        ),
        (
            "quota exceeded",
            Box::new(|v| v["tenants"][0]["quota"] = 1.into()),
        ),
        (
            "quotas over capacity",
            Box::new(|v| v["tenants"][0]["quota"] = 7.into()),
        ),
        ("capacity differs", Box::new(|v| v["capacity"] = 5.into())),
        ("unknown field", Box::new(|v| v["extra"] = 1.into())),
        (
            "duplicate tenant",
            Box::new(|v| v["tenants"][1]["name"] = "q".into()),
        ),
        (
            "owners short",
            Box::new(|v| {
                v["owners"].as_array_mut().unwrap().pop();
            }),
        ),
        (
            "counter overflow",
            Box::new(|v| {
                v["tenants"][0]["hits"] = u64::MAX.into();
                v["tenants"][1]["hits"] = 1.into();
            }),
        ),
    ];
    for (what, mutate) in mutations {
        let mut bad = v.clone();
        mutate(&mut bad);
        let err = decode_books(&bad.to_string()).unwrap_err();
        assert!(
            matches!(err, BankError::SnapshotCorrupt(_)),
            "{what}: {err}"
        );
    }
    assert!(matches!(
        decode_books("{"),
        Err(BankError::SnapshotCorrupt(_))
    ));
    // A huge capacity is refused before anything of that size is allocated.
    let huge = r#"{"capacity":4000000000,"auto_create":true,"tenants":[],"recency":[],"owners":[],"free":[0]}"#;
    assert!(matches!(
        decode_books(huge),
        Err(BankError::SnapshotCorrupt(_))
    ));
}

/// A tiny xorshift generator: deterministic random operation streams without extra crates.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Naive model: (slot, owner, last-use stamp) in a Vec, O(N) per operation. Shared books only.
#[test]
fn random_streams_agree_with_a_naive_model() {
    for seed in 1..20u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let n = 1 + rng.below(8) as u32;
        let mut b = shared(n.into());
        let mut used: Vec<(u32, String, u64)> = Vec::new();
        let mut free: Vec<u32> = (0..n).rev().collect();
        let mut clock = 0u64;
        for _ in 0..300 {
            clock += 1;
            match rng.below(3) {
                0 => {
                    let t = ["a", "b", "c"][rng.below(3) as usize];
                    let expect = if let Some(s) = free.pop() {
                        (s, None)
                    } else {
                        let i = (0..used.len()).min_by_key(|&i| used[i].2).unwrap();
                        let (s, owner, _) = used.remove(i);
                        (s, Some(owner))
                    };
                    used.push((expect.0, t.to_string(), clock));
                    assert_eq!(alloc(&mut b, t), expect);
                }
                1 if !used.is_empty() => {
                    let batch: Vec<u32> = (0..1 + rng.below(4))
                        .map(|_| used[rng.below(used.len() as u64) as usize].0)
                        .collect();
                    for &s in &batch {
                        clock += 1;
                        used.iter_mut().find(|u| u.0 == s).unwrap().2 = clock;
                    }
                    b.touch(&batch).unwrap();
                }
                _ if !used.is_empty() => {
                    let (s, _, _) = used.remove(rng.below(used.len() as u64) as usize);
                    free.push(s);
                    b.release(s).unwrap();
                }
                _ => {}
            }
            let mut order = used.clone();
            order.sort_by_key(|u| u.2);
            assert_eq!(
                b.recency(None).unwrap(),
                order.iter().map(|u| u.0).collect::<Vec<_>>()
            );
            assert_eq!(b.len() as usize, used.len());
        }
    }
}
