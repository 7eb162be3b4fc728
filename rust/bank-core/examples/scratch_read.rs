use drift_bank_core::skinny::read;
use std::time::Instant;
fn main() {
    let (d, f, kv) = (576usize, 1536usize, 192usize);
    let mut shapes = Vec::new();
    for _ in 0..30 { shapes.extend([(d, d), (kv, d), (kv, d), (d, d), (f, d), (f, d), (d, f)]); }
    shapes.push((49152, d));
    let ws: Vec<Vec<f32>> = shapes.iter().map(|&(n, k)| vec![1.0f32; n * k]).collect();
    let one = vec![1.0f32; 134_000_000];
    for threads in [1, 2, 1, 2] {
        let (mut a, mut b) = (f64::MAX, f64::MAX);
        for _ in 0..7 {
            let t = Instant::now(); let s: f32 = ws.iter().map(|w| read(w, threads)).sum(); std::hint::black_box(s); a = a.min(t.elapsed().as_secs_f64());
            let t = Instant::now(); std::hint::black_box(read(&one, threads)); b = b.min(t.elapsed().as_secs_f64());
        }
        println!("{threads} threads: 211 tensors {:.2} ms, one buffer {:.2} ms", a * 1e3, b * 1e3);
    }
}
