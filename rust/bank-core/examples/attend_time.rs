//! Wall time of the few-query attention kernel (`layer::attend`) on SmolLM2-135M's shapes (9
//! query heads over 3 KV heads of 64) after a 200-position prefix, for 1..16 queries, on one
//! thread or `threads`:
//!
//!     cargo run --release -p drift-bank-core --example attend_time [threads]
use drift_bank_core::layer::{attend, View};
use std::time::Instant;

fn main() {
    let threads: usize = std::env::args().nth(1).map_or(1, |s| s.parse().unwrap());
    let (hq, hkv, d, prefix) = (9, 3, 64, 200);
    let fill = |n: usize, seed: usize| (0..n).map(|i| ((i * 7919 + seed) % 1013) as f32 / 1013.0 - 0.5).collect::<Vec<f32>>();
    for s in [1usize, 4, 8, 16] {
        let len = prefix + s;
        let (q, k, v) = (fill(s * hq * d, 1), fill(hkv * len * d, 2), fill(hkv * len * d, 3));
        let mask: Vec<f32> = (0..s).flat_map(|i| (0..len).map(move |j| if j <= prefix + i { 0.0 } else { f32::MIN })).collect();
        let mut out = vec![0f32; s * hq * d];
        let kv = [hkv * len * d, len * d, d];
        let mut best = f64::MAX;
        for _ in 0..200 {
            let t = Instant::now();
            attend(View { data: &q, strides: [s * hq * d, hq * d, d] }, View { data: &k, strides: kv }, View { data: &v, strides: kv },
                   (s > 1).then_some((&mask[..], 0)), [1, s, hq, hkv, len, d], 0.125, &mut out, threads).unwrap();
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!("x{threads} {s:2} queries over {len} positions: {:6.1} µs", best * 1e6);
    }
}
