"""Bank snapshots through the binding: round trips, interop with the safetensors package, and
refusal of damaged files with typed errors (truncations at every section boundary and at many
offsets, flipped bytes, other versions, shapes disagreeing with metadata, wrong draft).

Damaged-but-well-formed files are crafted with the `safetensors` Python package and an
independent Python implementation of the documented checksum (docs/bank.md).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.numpy import save as st_save

from drift_cli import _bank
from drift_cli._bank import (Books, SnapshotCorrupt, SnapshotDraftMismatch, SnapshotError,
                             SnapshotVersionError, load_snapshot, read_snapshot_summary, save_snapshot)
from drift_cli.commands.bank import bank as bank_cli
from drift_cli.errors import BadInput

N, D, M = 6, 8, 3
DRAFT = "sha256:0123abcd"
CONFIG = {"lambda": 0.6, "tau": 0.8, "support": M}


def make_books() -> Books:
    b = Books(N, {"jargon": 2, "chat": None})
    for t in ["jargon", "chat", "jargon", "chat", "jargon"]:
        b.allocate(t)
    b.touch([1, 0, 3])
    b.release(2)
    return b


def make_arrays(key_dtype=np.float32, id_dtype=np.int64, count_dtype=np.int32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"keys": rng.standard_normal((N, D)).astype(key_dtype),
            "support": rng.integers(0, 50_000, (N, M)).astype(id_dtype),
            "bias": rng.standard_normal((N, M)).astype(np.float32),
            "counts": np.arange(N).astype(count_dtype)}


def make_meta(**extra: str) -> dict[str, str]:
    return {"draft_fingerprint": DRAFT, "config": json.dumps(CONFIG), **extra}


@pytest.fixture
def snap(tmp_path: Path) -> Path:
    path = tmp_path / "bank.safetensors"
    save_snapshot(str(path), make_books(), make_arrays(), make_meta())
    return path


# ---------------------------------------------------------------- crafting files

def checksum(tensors: dict[str, np.ndarray], meta: dict[str, str]) -> str:
    """The documented checksum, written independently of the Rust code."""
    h = hashlib.sha256(b"drift-bank-snapshot\0")

    def field(b: bytes) -> None:
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)

    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        field(name.encode())
        field(str(a.dtype).encode())
        h.update(a.ndim.to_bytes(8, "little"))
        for x in a.shape:
            h.update(x.to_bytes(8, "little"))
        field(a.tobytes())
    for k in sorted(meta):
        if k != "drift_bank.checksum":
            field(k.encode())
            field(meta[k].encode())
    return h.hexdigest()


def read_raw(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    with safe_open(str(path), "np") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata())


def craft(path: Path, tensors: dict[str, np.ndarray], meta: dict[str, str], fix_checksum: bool = True) -> Path:
    meta = dict(meta)
    if fix_checksum:
        meta["drift_bank.checksum"] = checksum(tensors, meta)
    out = path.with_name("crafted.safetensors")
    out.write_bytes(st_save(tensors, metadata=meta))
    return out


def sections(path: Path) -> list[int]:
    """Byte offsets where the file's sections begin and end: length prefix, header, each array."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    cuts = {0, 8, 8 + n, len(data)}
    for name, info in header.items():
        if name != "__metadata__":
            cuts.update(8 + n + off for off in info["data_offsets"])
    return sorted(cuts)


# ---------------------------------------------------------------- round trips

@pytest.mark.parametrize("dtypes", [(np.float32, np.int64, np.int32), (np.float16, np.int32, np.int64)])
def test_round_trip_keeps_arrays_books_and_meta(tmp_path: Path, dtypes):
    books, arrays = make_books(), make_arrays(*dtypes)
    path = tmp_path / "b.safetensors"
    save_snapshot(path, books, arrays, make_meta(note="hello"))
    loaded, got, meta = load_snapshot(path, expect_draft=DRAFT)
    assert meta == make_meta(note="hello")
    assert set(got) == set(arrays)
    for k in arrays:
        assert got[k].dtype == arrays[k].dtype and got[k].shape == arrays[k].shape
        assert np.array_equal(got[k], arrays[k]), k
        assert got[k].flags.c_contiguous and got[k].flags.writeable
    assert loaded.__getstate__() == books.__getstate__()
    assert loaded.recency("jargon") == books.recency("jargon")
    assert loaded.allocate("chat") == books.allocate("chat")


def test_non_contiguous_arrays_are_saved_by_value(tmp_path: Path):
    arrays = make_arrays()
    arrays["keys"] = np.asfortranarray(arrays["keys"])
    arrays["bias"] = np.ascontiguousarray(np.concatenate([arrays["bias"]] * 2, axis=1)[:, ::2])
    arrays["support"] = np.concatenate([arrays["support"], arrays["support"]], axis=1)[:, :M]
    save_snapshot(tmp_path / "b.safetensors", make_books(), arrays, make_meta())
    _, got, _ = load_snapshot(tmp_path / "b.safetensors")
    for k in arrays:
        assert np.array_equal(got[k], arrays[k]), k


def test_file_is_plain_safetensors_with_the_documented_metadata(snap: Path):
    tensors, meta = read_raw(snap)
    assert set(tensors) == {"keys", "support", "bias", "counts"}
    assert meta["drift_bank.format_version"] == "1"
    assert json.loads(meta["drift_bank.layout"]) == {
        "capacity": N, "dim": D, "support": M, "keys_dtype": "float32", "support_dtype": "int64",
        "bias_dtype": "float32", "counts_dtype": "int32"}
    books = json.loads(meta["drift_bank.books"])
    assert books["recency"] == make_books().recency()
    assert meta["drift_bank.checksum"] == checksum(tensors, meta)


def test_summary_and_inspect(snap: Path):
    s = read_snapshot_summary(str(snap))
    assert (s["N"], s["d"], s["m"], s["used"], s["format_version"]) == (N, D, M, 3, 1)
    assert s["draft_fingerprint"] == DRAFT and s["config"] == CONFIG and s["meta"] == {}
    assert s["array_bytes"] == N * (D * 4 + M * (8 + 4) + 4)
    assert s["file_bytes"] == snap.stat().st_size
    assert s["tenants"]["jargon"] == {"quota": 2, "used": 1, "hits": 1, "allocations": 3,
                                      "evictions": 1, "capacity": 2}
    assert s["tenants"]["chat"]["quota"] is None and s["tenants"]["chat"]["used"] == 2
    runner = CliRunner()
    as_json = runner.invoke(bank_cli, ["inspect", str(snap), "--json"])
    assert as_json.exit_code == 0 and json.loads(as_json.output) == json.loads(json.dumps(s))
    text = runner.invoke(bank_cli, ["inspect", str(snap)])
    assert text.exit_code == 0
    for needle in (DRAFT, "jargon", "chat", f"{N} / {D} / {M}", s["checksum"][:16]):
        assert needle in text.output


def test_inspect_refuses_bad_files_as_bad_input(snap: Path, tmp_path: Path):
    runner = CliRunner()
    (tmp_path / "cut.safetensors").write_bytes(snap.read_bytes()[:100])
    for path, needle in [(tmp_path / "cut.safetensors", "corrupt bank snapshot"),
                         (tmp_path / "missing.safetensors", "No such file")]:
        result = runner.invoke(bank_cli, ["inspect", str(path)])
        assert isinstance(result.exception, BadInput), result.output
        assert needle in str(result.exception) and str(path) in str(result.exception)


# ---------------------------------------------------------------- damage

def assert_refused(path: Path, data: bytes, kinds=(SnapshotCorrupt,)) -> None:
    path.write_bytes(data)
    with pytest.raises(SnapshotError) as info:
        load_snapshot(path)
    assert isinstance(info.value, kinds), f"{type(info.value).__name__}: {info.value}"


def test_truncation_at_every_section_boundary_and_many_offsets(snap: Path, tmp_path: Path):
    data = snap.read_bytes()
    cuts = sections(snap)
    assert len(cuts) == 3 + 4  # 0, 8, end of header = start of data, the end of each of 4 arrays
    offsets = {c + d for c in cuts for d in (-1, 0, 1)} | set(range(0, len(data), 11))
    bad = tmp_path / "cut.safetensors"
    for off in sorted(o for o in offsets if 0 <= o < len(data)):
        assert_refused(bad, data[:off])
    assert_refused(bad, data + b"\0")


def test_flipped_bytes_in_header_and_data(snap: Path, tmp_path: Path):
    data = snap.read_bytes()
    header_end = 8 + int.from_bytes(data[:8], "little")
    positions = list(range(header_end)) + list(range(header_end, len(data), 7))
    bad = tmp_path / "flip.safetensors"
    for i in positions:
        flipped = bytearray(data)
        flipped[i] ^= 0xFF
        assert_refused(bad, bytes(flipped), (SnapshotCorrupt, SnapshotVersionError))


def test_one_bit_in_a_key_fails_the_checksum(snap: Path, tmp_path: Path):
    tensors, meta = read_raw(snap)
    tensors["keys"][2, 3] = np.nextafter(tensors["keys"][2, 3], np.float32(np.inf))
    with pytest.raises(SnapshotCorrupt, match="checksum mismatch"):
        load_snapshot(craft(snap, tensors, meta, fix_checksum=False))


@pytest.mark.parametrize("version", ["2", "0", "999", "v1"])
def test_other_versions_raise_version_error(snap: Path, version: str):
    tensors, meta = read_raw(snap)
    meta["drift_bank.format_version"] = version
    with pytest.raises(SnapshotVersionError, match=f"format version {version} is not supported"):
        load_snapshot(craft(snap, tensors, meta))


def layout_edit(**changes):
    def edit(tensors, meta):
        layout = json.loads(meta["drift_bank.layout"])
        layout.update(changes)
        meta["drift_bank.layout"] = json.dumps(layout)
    return edit


def array_edit(name, fn):
    def edit(tensors, meta):
        tensors[name] = fn(tensors[name])
    return edit


def books_edit(key, fn):
    def edit(tensors, meta):
        books = json.loads(meta["drift_bank.books"])
        books[key] = fn(books[key])
        meta["drift_bank.books"] = json.dumps(books)
    return edit


INCONSISTENT = {
    "layout dim": layout_edit(dim=D + 1),
    "layout support": layout_edit(support=M - 1),
    "layout capacity": layout_edit(capacity=N + 1),
    "layout dtype": layout_edit(keys_dtype="float16"),
    "layout unknown dtype": layout_edit(bias_dtype="float64"),
    "keys extra row": array_edit("keys", lambda a: np.concatenate([a, a[:1]])),
    "bias narrower than support": array_edit("bias", lambda a: a[:, :-1].copy()),
    "counts 2-d": array_edit("counts", lambda a: a.reshape(N, 1)),
    "support as float": array_edit("support", lambda a: a.astype(np.float32)),
    "bias as float64": array_edit("bias", lambda a: a.astype(np.float64)),
    "array missing": lambda t, m: t.pop("counts"),
    "extra array": lambda t, m: t.update(extra=np.zeros(3, np.float32)),
    "recency repeats a slot": books_edit("recency", lambda r: r[:-1] + r[:1]),
    "recency not a permutation of used slots": books_edit("free", lambda f: f[1:]),
    "owner unknown": books_edit("owners", lambda o: [7] + o[1:]),
    "quota exceeded": books_edit("tenants", lambda ts: [{**ts[0], "quota": 0}] + ts[1:]),
    "books capacity": books_edit("capacity", lambda c: c + 1),
    "books capacity huge": books_edit("capacity", lambda c: 4_000_000_000),
    "books not json": lambda t, m: m.update({"drift_bank.books": "{"}),
    "no draft fingerprint": lambda t, m: m.pop("draft_fingerprint"),
    "config not json": lambda t, m: m.update(config="lambda=0.6"),
    "no checksum key": lambda t, m: m.pop("drift_bank.checksum"),
    # values no bank can hold (the checksum only proves the bytes are the writer's)
    "NaN key": array_edit("keys", lambda a: np.where(np.arange(a.size).reshape(a.shape) == 5, np.nan, a)
                          .astype(np.float32)),
    "inf key fp16": array_edit("keys", lambda a: np.full(a.shape, np.inf, np.float16)),
    "inf bias": array_edit("bias", lambda a: np.where(a > 0, np.inf, a).astype(np.float32)),
    "NaN bias": array_edit("bias", lambda a: np.full_like(a, np.nan)),
    "negative support id": array_edit("support", lambda a: -a - 1),
    "negative count": array_edit("counts", lambda a: a - 3),
}


@pytest.mark.parametrize("what", sorted(INCONSISTENT))
def test_inconsistent_snapshots_are_corrupt_even_with_a_valid_checksum(snap: Path, what: str):
    tensors, meta = read_raw(snap)
    INCONSISTENT[what](tensors, meta)
    with pytest.raises(SnapshotCorrupt):
        load_snapshot(craft(snap, tensors, meta, fix_checksum=what != "no checksum key"))


def test_wrong_draft_is_refused(snap: Path):
    with pytest.raises(SnapshotDraftMismatch, match="sha256:other"):
        load_snapshot(snap, expect_draft="sha256:other")
    assert load_snapshot(snap, expect_draft=DRAFT)[2]["draft_fingerprint"] == DRAFT


@pytest.mark.parametrize("data", [b"", b"\0" * 8, (2**63).to_bytes(8, "little") + b"{}",
                                  (2).to_bytes(8, "little") + b"{}", b"PK\x03\x04 not a snapshot"])
def test_non_snapshots_are_corrupt(tmp_path: Path, data: bytes):
    assert_refused(tmp_path / "x.safetensors", data)


def test_plain_safetensors_without_bank_metadata_is_corrupt(tmp_path: Path):
    path = tmp_path / "plain.safetensors"
    path.write_bytes(st_save(make_arrays()))
    with pytest.raises(SnapshotCorrupt, match="not a DRIFT bank snapshot"):
        load_snapshot(path)


def test_io_errors_are_os_errors(tmp_path: Path):
    with pytest.raises(FileNotFoundError) as info:
        load_snapshot(tmp_path / "missing.safetensors")
    assert info.value.filename == str(tmp_path / "missing.safetensors")
    with pytest.raises(IsADirectoryError):
        load_snapshot(tmp_path)
    with pytest.raises(FileNotFoundError):
        save_snapshot(tmp_path / "no" / "dir.safetensors", make_books(), make_arrays(), make_meta())


# ---------------------------------------------------------------- saving

UNSAVABLE = {
    "missing config": (lambda a, m: m.pop("config"), "must include \"config\""),
    "config not json": (lambda a, m: m.update(config="{oops"), "JSON"),
    "reserved key": (lambda a, m: m.update({"drift_bank.books": "x"}), "reserved"),
    "missing array": (lambda a, m: a.pop("bias"), "exactly"),
    "wrong N": (lambda a, m: a.update(counts=np.zeros(N + 1, np.int32)), "expected"),
    "bias float16": (lambda a, m: a.update(bias=a["bias"].astype(np.float16)), "bias must be"),
    "keys float64": (lambda a, m: a.update(keys=a["keys"].astype(np.float64)), "float64"),
    "a list": (lambda a, m: a.update(counts=[0.5] * N), "float64"),
}


@pytest.mark.parametrize("what", sorted(UNSAVABLE))
def test_unsavable_input_raises_snapshot_error_and_keeps_the_old_file(snap: Path, what: str):
    before = snap.read_bytes()
    arrays, meta = make_arrays(), make_meta()
    edit, needle = UNSAVABLE[what]
    edit(arrays, meta)
    with pytest.raises(SnapshotError, match=needle) as info:
        save_snapshot(snap, Books(N), arrays, meta)
    assert type(info.value) is SnapshotError
    assert snap.read_bytes() == before
    assert os.listdir(snap.parent) == [snap.name], "no temp file left behind"


def test_save_replaces_an_existing_snapshot(snap: Path):
    books = make_books()
    books.allocate("chat")
    save_snapshot(snap, books, make_arrays(), make_meta(round="2"))
    loaded, _, meta = load_snapshot(snap)
    assert meta["round"] == "2" and loaded.__getstate__() == books.__getstate__()
    assert os.listdir(snap.parent) == [snap.name]
    assert _bank.SNAPSHOT_FORMAT_VERSION == int(read_raw(snap)[1]["drift_bank.format_version"])
