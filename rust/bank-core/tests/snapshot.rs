//! Snapshots: round trip, atomic write, and refusal of every kind of damage with a typed error.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use drift_bank_core::snapshot::{
    self, checksum, decode, encode, META_CHECKSUM, META_LAYOUT, META_VERSION,
};
use drift_bank_core::{ArrayRef, BankError, Books, ElementType, FORMAT_VERSION};
use safetensors::SafeTensors;

const N: usize = 6;
const D: usize = 4;
const M: usize = 3;

struct Arrays {
    keys: Vec<u8>,
    support: Vec<u8>,
    bias: Vec<u8>,
    counts: Vec<u8>,
}

fn le<T: Copy, const K: usize>(xs: impl Iterator<Item = T>, f: fn(T) -> [u8; K]) -> Vec<u8> {
    xs.flat_map(f).collect()
}

fn arrays() -> Arrays {
    Arrays {
        keys: le((0..N * D).map(|i| i as f32 * 0.25), f32::to_le_bytes),
        support: le((0..N * M).map(|i| (i * 7) as i64), i64::to_le_bytes),
        bias: le((0..N * M).map(|i| -(i as f32)), f32::to_le_bytes),
        counts: le((0..N).map(|i| i as i32), i32::to_le_bytes),
    }
}

fn views(a: &Arrays) -> BTreeMap<String, ArrayRef<'_>> {
    let v = |dtype, shape: &[usize], data| ArrayRef {
        dtype,
        shape: shape.to_vec(),
        data,
    };
    BTreeMap::from([
        (
            "keys".to_string(),
            v(ElementType::Float32, &[N, D], &a.keys[..]),
        ),
        (
            "support".to_string(),
            v(ElementType::Int64, &[N, M], &a.support[..]),
        ),
        (
            "bias".to_string(),
            v(ElementType::Float32, &[N, M], &a.bias[..]),
        ),
        (
            "counts".to_string(),
            v(ElementType::Int32, &[N], &a.counts[..]),
        ),
    ])
}

fn meta() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("draft_fingerprint".to_string(), "sha256:draft".to_string()),
        ("config".to_string(), r#"{"lambda": 0.6}"#.to_string()),
    ])
}

fn books() -> Books {
    let mut b = Books::new(N as u64, None).unwrap();
    for t in ["a", "b", "a", "a"] {
        b.allocate(t).unwrap();
    }
    b.touch(&[0, 2]).unwrap();
    b.release(1).unwrap();
    b
}

fn good_bytes() -> Vec<u8> {
    let a = arrays();
    encode(&books(), &views(&a), &meta()).unwrap()
}

/// Re-encodes a snapshot's arrays with edited metadata and, if asked, a recomputed checksum:
/// files that are well-formed safetensors but wrong in one precise way.
fn reencode(
    bytes: &[u8],
    edit: impl Fn(&mut BTreeMap<String, String>),
    fix_checksum: bool,
) -> Vec<u8> {
    let st = SafeTensors::deserialize(bytes).unwrap();
    let (_, header) = SafeTensors::read_metadata(bytes).unwrap();
    let mut full: BTreeMap<String, String> =
        header.metadata().clone().unwrap().into_iter().collect();
    edit(&mut full);
    let tensors = st.tensors();
    let owned: Vec<(String, ElementType, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, v)| {
            let t = match v.dtype() {
                safetensors::Dtype::F32 => ElementType::Float32,
                safetensors::Dtype::I64 => ElementType::Int64,
                _ => ElementType::Int32,
            };
            (n.clone(), t, v.shape().to_vec(), v.data().to_vec())
        })
        .collect();
    if fix_checksum {
        let sum = checksum(
            owned
                .iter()
                .map(|(n, t, s, d)| (n.as_str(), *t, &s[..], &d[..])),
            &full,
        );
        full.insert(META_CHECKSUM.into(), sum);
    }
    let refs: Vec<(String, ArrayRef<'_>)> = owned
        .iter()
        .map(|(n, t, s, d)| {
            (
                n.clone(),
                ArrayRef {
                    dtype: *t,
                    shape: s.clone(),
                    data: &d[..],
                },
            )
        })
        .collect();
    let header: HashMap<String, String> = full.into_iter().collect();
    safetensors::serialize(refs.iter().map(|(n, r)| (n.as_str(), r)), Some(header)).unwrap()
}

fn is_snapshot_error(e: &BankError) -> bool {
    matches!(
        e,
        BankError::SnapshotCorrupt(_)
            | BankError::SnapshotVersion { .. }
            | BankError::SnapshotDraftMismatch { .. }
    )
}

#[test]
fn round_trip_keeps_books_arrays_and_meta() {
    let a = arrays();
    let bytes = encode(&books(), &views(&a), &meta()).unwrap();
    let snap = decode(bytes, Some("sha256:draft")).unwrap();
    assert_eq!(snap.meta, meta());
    assert_eq!(
        snap.books.recency(None).unwrap(),
        books().recency(None).unwrap()
    );
    assert_eq!(
        snap.books.stats(Some("a")).unwrap(),
        books().stats(Some("a")).unwrap()
    );
    let got: Vec<(&str, &[u8])> = snap
        .arrays
        .iter()
        .map(|x| (x.name.as_str(), snap.array_data(x)))
        .collect();
    assert_eq!(
        got,
        vec![
            ("keys", &a.keys[..]),
            ("support", &a.support[..]),
            ("bias", &a.bias[..]),
            ("counts", &a.counts[..])
        ]
    );
    assert_eq!(
        (snap.layout.capacity, snap.layout.dim, snap.layout.support),
        (N as u64, D as u64, M as u64)
    );
    assert_eq!(
        snap.layout.array_bytes(),
        (N * (D * 4 + M * (8 + 4) + 4)) as u64
    );
}

#[test]
fn every_truncation_is_refused() {
    let bytes = good_bytes();
    for len in 0..bytes.len() {
        let err = decode(bytes[..len].to_vec(), None).unwrap_err();
        assert!(
            matches!(err, BankError::SnapshotCorrupt(_)),
            "truncated to {len}: {err}"
        );
    }
}

#[test]
fn every_flipped_byte_is_refused() {
    let bytes = good_bytes();
    for i in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[i] ^= 0xFF;
        let err = decode(bad, None).unwrap_err();
        assert!(is_snapshot_error(&err), "byte {i}: {err}");
    }
}

#[test]
fn an_appended_byte_is_refused() {
    let mut bytes = good_bytes();
    bytes.push(0);
    assert!(matches!(
        decode(bytes, None),
        Err(BankError::SnapshotCorrupt(_))
    ));
}

#[test]
fn other_versions_are_refused_with_a_version_error() {
    for v in ["2", "0", "one"] {
        let bad = reencode(
            &good_bytes(),
            |m| {
                m.insert(META_VERSION.into(), v.into());
            },
            true,
        );
        let err = decode(bad, None).unwrap_err();
        assert!(
            matches!(err, BankError::SnapshotVersion { ref found, supported } if found == v && supported == FORMAT_VERSION),
            "{err}"
        );
    }
    let bad = reencode(
        &good_bytes(),
        |m| {
            m.remove(META_VERSION);
        },
        true,
    );
    assert!(matches!(
        decode(bad, None),
        Err(BankError::SnapshotCorrupt(_))
    ));
}

#[test]
fn metadata_edits_without_a_new_checksum_are_refused() {
    let bad = reencode(
        &good_bytes(),
        |m| {
            m.insert("config".into(), "{}".into());
        },
        false,
    );
    let err = decode(bad, None).unwrap_err();
    assert!(
        matches!(err, BankError::SnapshotCorrupt(ref s) if s.contains("checksum")),
        "{err}"
    );
}

#[test]
fn shapes_that_disagree_with_the_layout_are_refused() {
    let edits: [(&str, &str); 4] = [
        (
            "dim",
            r#"{"capacity":6,"dim":5,"support":3,"keys_dtype":"float32","support_dtype":"int64","bias_dtype":"float32","counts_dtype":"int32"}"#,
        ),
        (
            "capacity",
            r#"{"capacity":7,"dim":4,"support":3,"keys_dtype":"float32","support_dtype":"int64","bias_dtype":"float32","counts_dtype":"int32"}"#,
        ),
        (
            "dtype",
            r#"{"capacity":6,"dim":4,"support":3,"keys_dtype":"float16","support_dtype":"int64","bias_dtype":"float32","counts_dtype":"int32"}"#,
        ),
        ("garbage", r#"{"capacity":6}"#),
    ];
    for (what, layout) in edits {
        let bad = reencode(
            &good_bytes(),
            |m| {
                m.insert(META_LAYOUT.into(), layout.into());
            },
            true,
        );
        let err = decode(bad, None).unwrap_err();
        assert!(
            matches!(err, BankError::SnapshotCorrupt(_)),
            "{what}: {err}"
        );
    }
}

#[test]
fn missing_caller_metadata_is_refused_on_load() {
    let bad = reencode(
        &good_bytes(),
        |m| {
            m.remove("draft_fingerprint");
        },
        true,
    );
    assert!(matches!(
        decode(bad, None),
        Err(BankError::SnapshotCorrupt(_))
    ));
}

#[test]
fn wrong_draft_is_refused() {
    let err = decode(good_bytes(), Some("sha256:other")).unwrap_err();
    assert!(
        matches!(err, BankError::SnapshotDraftMismatch { ref expected, ref found } if expected == "sha256:other" && found == "sha256:draft"),
        "{err}"
    );
}

#[test]
fn unsavable_input_is_refused_before_writing() {
    let a = arrays();
    type Edit = Box<dyn Fn(&mut BTreeMap<String, ArrayRef<'_>>, &mut BTreeMap<String, String>)>;
    let cases: Vec<(&str, Edit)> = vec![
        (
            "missing array",
            Box::new(|v, _| {
                v.remove("counts");
            }),
        ),
        (
            "extra array",
            Box::new(|v, _| {
                let k = v["keys"].clone();
                v.insert("more".into(), k);
            }),
        ),
        (
            "bias int",
            Box::new(|v, _| v.get_mut("bias").unwrap().dtype = ElementType::Int32),
        ),
        (
            "wrong N",
            Box::new(|v, _| v.get_mut("counts").unwrap().shape = vec![3, 2]),
        ),
        (
            "bytes vs shape",
            Box::new(|v, _| v.get_mut("keys").unwrap().shape = vec![N, D + 1]),
        ),
        (
            "bias vs support",
            Box::new(|v, _| {
                let b = v.get_mut("bias").unwrap();
                b.shape = vec![N, 1];
                b.data = &b.data[..N * 4];
            }),
        ),
        (
            "no draft",
            Box::new(|_, m| {
                m.remove("draft_fingerprint");
            }),
        ),
        (
            "config not json",
            Box::new(|_, m| {
                m.insert("config".into(), "lambda=0.6".into());
            }),
        ),
        (
            "reserved key",
            Box::new(|_, m| {
                m.insert("drift_bank.books".into(), "{}".into());
            }),
        ),
    ];
    for (what, edit) in cases {
        let (mut v, mut m) = (views(&a), meta());
        edit(&mut v, &mut m);
        let err = encode(&books(), &v, &m).unwrap_err();
        assert!(matches!(err, BankError::SnapshotInput(_)), "{what}: {err}");
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("drift-bank-test-{}-{name}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn save_replaces_atomically_and_leaves_no_temp_files() {
    let dir = temp_dir("atomic");
    let path = dir.join("bank.safetensors");
    let a = arrays();
    snapshot::save(&path, &books(), &views(&a), &meta()).unwrap();
    let mut other = meta();
    other.insert("note".into(), "second".into());
    snapshot::save(&path, &books(), &views(&a), &other).unwrap();
    let snap = snapshot::load(&path, None).unwrap();
    assert_eq!(snap.meta["note"], "second");
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("bank.safetensors")]);
    let err = snapshot::load(&dir.join("missing.safetensors"), None).unwrap_err();
    assert!(
        matches!(err, BankError::Io { ref source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    );
    // A failed write (directory missing) leaves nothing behind and reports the path.
    let err = snapshot::save(
        &dir.join("no/such/dir.safetensors"),
        &books(),
        &views(&a),
        &meta(),
    )
    .unwrap_err();
    assert!(matches!(err, BankError::Io { .. }), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A snapshot whose checksum holds but whose values no bank could hold: NaN or inf keys and
/// biases, negative support ids or counts. Each is refused as corrupt, naming the array.
#[test]
fn values_a_bank_cannot_hold_are_refused() {
    let edits: [(&str, fn(&mut Arrays)); 5] = [
        ("keys", |a| {
            a.keys[0..4].copy_from_slice(&f32::NAN.to_le_bytes())
        }),
        ("keys", |a| {
            a.keys[4..8].copy_from_slice(&f32::INFINITY.to_le_bytes())
        }),
        ("bias", |a| {
            a.bias[8..12].copy_from_slice(&f32::NEG_INFINITY.to_le_bytes())
        }),
        ("support", |a| {
            a.support[8..16].copy_from_slice(&(-1i64).to_le_bytes())
        }),
        ("counts", |a| {
            a.counts[4..8].copy_from_slice(&(-3i32).to_le_bytes())
        }),
    ];
    for (name, edit) in edits {
        let mut a = arrays();
        edit(&mut a);
        let bytes = encode(&books(), &views(&a), &meta()).unwrap();
        let err = decode(bytes, None).unwrap_err();
        assert!(
            matches!(err, BankError::SnapshotCorrupt(_)),
            "{name}: {err}"
        );
        assert!(err.to_string().contains(name), "{name}: {err}");
    }
}

/// Only regular files are read (a FIFO would block, /dev/zero never ends) and only a regular
/// file or nothing is replaced by a save (never a directory or a device node).
#[test]
fn only_regular_files_are_read_or_replaced() {
    let dir = temp_dir("regular");
    let a = arrays();
    let err = snapshot::load(&dir, None).unwrap_err();
    assert!(matches!(err, BankError::Io { .. }), "{err}");
    let err = snapshot::load(std::path::Path::new("/dev/zero"), None).unwrap_err();
    assert!(err.to_string().contains("not a regular file"), "{err}");
    let err = snapshot::save(&dir, &books(), &views(&a), &meta()).unwrap_err();
    assert!(matches!(err, BankError::SnapshotInput(_)), "{err}");
    let fifo = dir.join("fifo.bank");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let err = snapshot::load(&fifo, None).unwrap_err(); // at once: the FIFO is never opened
    assert!(err.to_string().contains("not a regular file"), "{err}");
    let err = snapshot::save(&fifo, &books(), &views(&a), &meta()).unwrap_err();
    assert!(err.to_string().contains("not a regular file"), "{err}");
    assert!(!std::fs::metadata(&fifo).unwrap().file_type().is_file()); // still the FIFO
    std::fs::remove_dir_all(&dir).ok();
}
