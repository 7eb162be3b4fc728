//! Raw speed of the core (no Python): ns per touched slot and per allocation at N = 4096.
//!     cargo run --release --example touch_speed
use drift_bank_core::Books;
use std::time::Instant;

fn main() {
    let n = 4096u32;
    let mut b = Books::new(n.into(), None).unwrap();
    for _ in 0..n {
        b.allocate("default").unwrap();
    }
    let mut x = 0x2545F4914F6CDD1Du64;
    let slots: Vec<u32> = (0..4_000_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % u64::from(n)) as u32
        })
        .collect();
    let t = Instant::now();
    for chunk in slots.chunks(16) {
        b.touch(chunk).unwrap();
    }
    let touch_ns = t.elapsed().as_nanos() as f64 / slots.len() as f64;
    let t = Instant::now();
    for _ in 0..1_000_000 {
        b.allocate("default").unwrap();
    }
    let alloc_ns = t.elapsed().as_nanos() as f64 / 1e6;
    println!("touch {touch_ns:.1} ns/slot (batches of 16), allocate {alloc_ns:.1} ns");
}
