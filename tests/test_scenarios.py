"""Scenario schema, caching, manifests, streams and ad-hoc corpora on small fixture data.

The fixture scenarios live in a temporary scenario directory and read small text files written
by the tests, so these run in about a second; tests/test_scenarios_real.py covers the shipped
scenarios on the machine's real sources.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

import drift_cli.scenarios as S
from drift_cli.errors import BadInput
from drift_cli.scenarios.build import forget_loaded
from drift_cli.scenarios.cleaning import normalised_sha256, troff_to_text
from drift_cli.scenarios.schema import load_scenario_file


class ByteTokenizer:
    """A stand-in for a Hugging Face tokenizer: one id per UTF-8 byte."""

    def encode(self, text, add_special_tokens=False):
        assert add_special_tokens is False
        return list(text.encode())


WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


def prose(seed: int, words: int = 300) -> str:
    # distinct, deterministic text per seed; paragraph breaks every 40 words
    out = []
    for i in range(words):
        out.append(WORDS[(seed * 7 + i * (seed % 5 + 1)) % len(WORDS)] + str(seed))
        if i % 40 == 39:
            out.append("\n\n")
    return " ".join(out)


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A scenario dir with defaults and two fixture scenarios over files in tmp_path/src."""
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "b").mkdir(parents=True)
    for i in range(60):
        (src / "a" / f"doc{i:02d}.txt").write_text(prose(i))
        (src / "b" / f"doc{i:02d}.txt").write_text(prose(100 + i))
    (src / "a" / "dup.txt").write_text("  " + prose(3).replace(" ", "   "))   # whitespace-duplicate of doc03
    sdir = tmp_path / "scenarios"
    sdir.mkdir()
    (sdir / "defaults.toml").write_text(textwrap.dedent("""
        min_doc_chars = 100
        [split]
        salt = "test"
        [stream]
        prompt_tokens = 32
        max_new_tokens = 16
        windows_per_doc = 2
        [stream.prompts]
        train = 10
        dev = 5
        test = 8
    """))
    for name in ("alpha", "beta"):
        sub = "a" if name == "alpha" else "b"
        (sdir / f"{name}.toml").write_text(textwrap.dedent(f"""
            version = 1
            description = "fixture {name}"
            domain = "{name}"
            draft_data = "{'train' if name == 'alpha' else 'none'}"
            [[sources]]
            id = "files"
            extractor = "text_files"
            package = "fixture-{name}"
            licence = "CC0"
            root = "{src / sub}"
            include = ["*.txt"]
        """))
    (sdir / "mix.toml").write_text(textwrap.dedent("""
        version = 1
        description = "fixture mix"
        domain = "mixed"
        components = ["alpha", "beta"]
        [stream]
        order = "block"
        block_prompts = 2
        variants = ["mixture"]
        tenants = "domain"
    """))
    monkeypatch.setenv("DRIFT_SCENARIO_DIR", str(sdir))
    monkeypatch.setenv("DRIFT_CACHE_DIR", str(tmp_path / "cache"))
    forget_loaded()
    yield {"src": src, "sdir": sdir, "cache": tmp_path / "cache"}
    forget_loaded()


def write_scenario(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "bad.toml"
    p.write_text(textwrap.dedent(body))
    return p


GOOD = """
    version = 1
    description = "d"
    [[sources]]
    id = "s"
    extractor = "text_files"
    licence = "CC0"
    root = "/nonexistent"
"""


# ---- schema ------------------------------------------------------------------------------------

@pytest.mark.parametrize("edit, message", [
    (lambda s: s.replace("version = 1", "version = 0"), "field 'version': must be > 0"),
    (lambda s: s.replace("version = 1", 'version = "1"'), "field 'version': expected int"),
    (lambda s: s.replace('description = "d"', ""), "field 'description': missing"),
    (lambda s: "strem = 3\n" + s, "field 'strem': unknown field (did you mean 'stream'?)"),
    (lambda s: s.replace('"text_files"', '"text_file"'), "field 'sources[0].extractor': must be one of"),
    (lambda s: s.replace('licence = "CC0"', ""), "field 'sources[0].licence': missing"),
    (lambda s: s.replace('id = "s"', 'id = "a:b"'), "field 'sources[0].id'"),
    (lambda s: s + "\n[split]\ntrain = 0.9\n", "field 'split.train': train + dev + test must be 1"),
    (lambda s: s + '\n[split]\ncutoff = "2010-13-01"\n', "field 'split.cutoff': must be an ISO date"),
    (lambda s: s + '\n[stream]\norder = "blok"\n', "field 'stream.order': must be one of"),
    (lambda s: s + "\n[stream]\nprompt_tokens = -4\n", "field 'stream.prompt_tokens': must be > 0"),
    (lambda s: s + "\n[stream.prompts]\ntest = 0\n", "field 'stream.prompts': 'test' must be a positive integer"),
    (lambda s: 'draft_data = "pre_cutoff"\n' + s, "field 'draft_data': 'pre_cutoff' needs split.cutoff"),
    (lambda s: "version = 2\n" + s, "not valid TOML"),
])
def test_bad_scenario_fields_name_file_and_field(tmp_path, edit, message):
    path = write_scenario(tmp_path, edit(textwrap.dedent(GOOD)))
    with pytest.raises(BadInput) as e:
        load_scenario_file(path)
    assert str(path) in str(e.value)
    assert message in str(e.value)


def test_good_scenario_parses_with_defaults(tmp_path):
    path = write_scenario(tmp_path, GOOD)
    sc = load_scenario_file(path, {"stream": {"prompt_tokens": 17}, "split": {"salt": "x"}})
    assert sc.name == "bad" and sc.stream.prompt_tokens == 17 and sc.split.salt == "x"
    assert sc.stream.max_new_tokens == 128 and sc.split.train == 0.8


def test_unknown_scenario_suggests_closest(env):
    with pytest.raises(BadInput, match="unknown scenario 'alpah' \\(did you mean 'alpha'\\?\\)"):
        S.load_scenario("alpah")
    with pytest.raises(BadInput, match="unknown split 'tset'"):
        S.documents("alpha", "tset")


def test_missing_source_names_the_package(env, tmp_path):
    sc = S.load_scenario("alpha")
    import dataclasses

    gone = dataclasses.replace(sc, sources=(dataclasses.replace(sc.sources[0], root=str(tmp_path / "gone")),))
    with pytest.raises(BadInput, match="provided by the OS package 'fixture-alpha' \\(apt-get install fixture-alpha"):
        S.documents(gone, "test")


# ---- splits, caching, manifests ----------------------------------------------------------------

def test_splits_disjoint_and_deduplicated(env):
    all_docs = {s: S.documents("alpha", s) for s in ("train", "dev", "test")}
    ids = [d.id for docs in all_docs.values() for d in docs]
    hashes = [normalised_sha256(d.text) for docs in all_docs.values() for d in docs]
    assert len(ids) == len(set(ids)) == len(set(hashes)) == 60   # dup.txt collapsed into doc03
    assert all(len(docs) > 0 for docs in all_docs.values())


def test_build_twice_gives_identical_manifests(env):
    first = S.build("alpha")[0]
    assert first.built
    forget_loaded()
    again = S.build("alpha")[0]
    assert not again.built and again.sources_built == []
    assert again.manifests == first.manifests
    forget_loaded()
    forced = S.build("alpha", force=True)[0]
    assert forced.built and forced.manifests == first.manifests
    m = first.manifests["test"]
    assert m["documents"] == len(S.documents("alpha", "test"))
    f0 = m["sources"][0]["files"][0]
    assert set(f0) == {"path", "bytes", "sha256", "documents"} and m["sources"][0]["package"] == "fixture-alpha"


def test_changed_recipe_rebuilds_only_what_it_affects(env):
    a0, b0 = S.build("alpha")[0], S.build("beta")[0]
    assert a0.built and b0.built
    path = env["sdir"] / "beta.toml"
    path.write_text(path.read_text().replace('include = ["*.txt"]', 'include = ["doc0*.txt", "doc1*.txt", "doc2*.txt"]'))
    forget_loaded()
    a1, b1 = S.build("alpha")[0], S.build("beta")[0]
    assert not a1.built and a1.key == a0.key
    assert b1.built and b1.sources_built == ["files"] and b1.key != b0.key
    # a changed split rule re-splits but reuses the cached extraction
    path.write_text(path.read_text() + '\n[split]\nsalt = "other"\n')
    forget_loaded()
    b2 = S.build("beta")[0]
    assert b2.built and b2.sources_built == ["files"]    # the salt is part of the source key (budget order)
    # changed source bytes rebuild too
    (env["src"] / "a" / "doc05.txt").write_text(prose(999))
    forget_loaded()
    a2 = S.build("alpha")[0]
    assert a2.built and a2.key != a0.key
    # pruning keeps exactly the latest build of each scenario and the sources it uses
    from drift_cli.scenarios.build import prune_cache

    removed = prune_cache()
    assert a0.directory in removed and b0.directory in removed and b1.directory in removed
    assert sorted(p.name for p in (env["cache"] / "scenarios" / "splits" / "alpha").iterdir()) == [a2.key, "latest.json"]
    assert len(list((env["cache"] / "scenarios" / "sources").glob("*.jsonl"))) == 2
    forget_loaded()
    assert not S.build("alpha")[0].built and not S.build("beta")[0].built and prune_cache() == []


def test_draft_and_target_training_documents(env):
    draft = {d.id for d in S.draft_training_documents()}
    target = {d.id for d in S.target_training_documents()}
    assert draft == {d.id for d in S.documents("alpha", "train")}
    assert target == draft | {d.id for d in S.documents("beta", "train")}
    for split in ("dev", "test"):
        assert draft.isdisjoint(d.id for d in S.documents("alpha", split))


# ---- streams -----------------------------------------------------------------------------------

def test_stream_is_deterministic_and_well_formed(env):
    tok = ByteTokenizer()
    s1 = S.build_stream("alpha", "test", tok)
    forget_loaded()
    s2 = S.build_stream("alpha", "test", tok)
    assert s1.identity() == s2.identity() and len(s1.prompts) == 8
    test_ids = {d.id for d in S.documents("alpha", "test")}
    texts = {d.id: d.text for d in S.documents("alpha", "test")}
    for p in s1.prompts:
        assert len(p.ids) == 32 and p.doc_id in test_ids and p.domain == "alpha"
        assert bytes(p.ids).decode() in texts[p.doc_id]
    assert s1.max_new_tokens == 16
    assert len(S.build_stream("alpha", "test", tok, max_prompts=3).prompts) == 3
    assert S.build_stream("alpha", "dev", tok).identity() != s1.identity()


def test_block_and_mixture_variants(env):
    tok = ByteTokenizer()
    block = S.build_stream("mix", "test", tok, max_prompts=8)
    assert [p.domain for p in block.prompts] == ["alpha", "alpha", "beta", "beta"] * 2
    assert all(p.tenant == p.domain for p in block.prompts)
    assert block.meta["split_sha256"] == {n: S.build(n)[0].manifests["test"]["sha256"] for n in ("alpha", "beta")}
    mixture = S.build_stream("mix", "test", tok, max_prompts=8, variant="mixture")
    assert mixture.meta["order"] == "mixture" and len(mixture.prompts) == 8
    assert mixture.identity() == S.build_stream("mix", "test", tok, max_prompts=8, variant="mixture").identity()
    with pytest.raises(BadInput, match="no stream variant 'mixtur' \\(did you mean 'mixture'\\?\\)"):
        S.build_stream("mix", "test", tok, variant="mixtur")


def test_mixture_weights_drift_smoothly():
    from drift_cli.scenarios.streams import mixture_weights

    first, last = mixture_weights(0, 40, 5), mixture_weights(39, 40, 5)
    assert first.index(max(first)) == 0 and last.index(max(last)) == 4
    assert all(abs(sum(mixture_weights(i, 40, 5)) - 1) < 1e-12 for i in range(40))


# ---- ad-hoc corpora ----------------------------------------------------------------------------

def _corpus_checks(sc):
    splits = {s: S.documents(sc, s) for s in ("train", "dev", "test")}
    ids = [d.id for v in splits.values() for d in v]
    assert len(ids) == len(set(ids)) and splits["dev"] and splits["test"]
    stream = S.build_stream(sc, "test", ByteTokenizer(), max_prompts=4)
    assert len(stream.prompts) == 4 and stream.scenario == sc.name
    return splits


def test_corpus_text_file(env, tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("\n\n".join(prose(i, 80) for i in range(80)))
    sc = S.corpus_scenario(path)
    assert sc.name == "corpus-book"
    splits = _corpus_checks(sc)
    joined = sorted((d for v in splits.values() for d in v), key=lambda d: int(d.id.rsplit("@", 1)[1]))
    assert " ".join(d.text for d in joined).split() == path.read_text().split()   # nothing lost


def test_corpus_directory(env, tmp_path):
    d = tmp_path / "notes"
    d.mkdir()
    for i in range(30):
        (d / f"n{i}.md").write_text(prose(i, 400))
    (d / "blob.bin").write_bytes(b"\x00\x01" * 100)
    splits = _corpus_checks(S.corpus_scenario(d))
    sources = {Path(doc.source).name for v in splits.values() for doc in v}
    assert sources == {f"n{i}.md" for i in range(30)}            # every note, and the binary file excluded
    assert not any("\x00" in doc.text for v in splits.values() for doc in v)


def test_corpus_jsonl(env, tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps({"text": prose(i, 60), "other": i}) + "\n" for i in range(120)))
    _corpus_checks(S.corpus_scenario(path))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": "x"}\n')
    with pytest.raises(BadInput, match="bad.jsonl:1: no string field 'text'"):
        S.documents(S.corpus_scenario(bad), "test")
    with pytest.raises(BadInput, match="no such file or directory"):
        S.corpus_scenario(tmp_path / "missing.txt")


# ---- cleaning ----------------------------------------------------------------------------------

def test_troff_to_text():
    src = '.\\" comment\n.TH LS 1\n.SH BESCHREIBUNG\nAuflistung \\fBvon\\fP Dateien\\-Infos\n.TP\n\\fB\\-a\\fR, \\fB\\-\\-all\\fR\n.BR ls (1)\n'
    assert troff_to_text(src) == "BESCHREIBUNG\n\nAuflistung von Dateien-Infos\n\n-a, --all\nls(1)"


# ---- drift data build|list ---------------------------------------------------------------------

def test_data_build_and_list_commands(env):
    from click.testing import CliRunner

    from drift_cli.commands.data import data

    runner = CliRunner()
    listed = json.loads(runner.invoke(data, ["list", "--json"]).output)
    assert [r["scenario"] for r in listed] == ["alpha", "beta", "mix"]
    assert all(r["sources"] == "present" and r["splits"] is None for r in listed)
    built = runner.invoke(data, ["build", "mix", "--json"])
    assert built.exit_code == 0, built.output
    summary = json.loads(built.stdout)
    assert [s["scenario"] for s in summary] == ["alpha", "beta"] and all(s["built"] for s in summary)
    listed = json.loads(runner.invoke(data, ["list", "--json"]).output)
    alpha = listed[0]["splits"]
    assert alpha["test"]["documents"] == len(S.documents("alpha", "test"))
    assert listed[2]["splits"]["test"]["documents"] == sum(len(S.documents(n, "test")) for n in ("alpha", "beta"))
    forget_loaded()
    again = json.loads(runner.invoke(data, ["build", "--json"]).stdout)
    assert not any(s["built"] for s in again)
    assert [s["splits"] for s in again] == [s["splits"] for s in summary]
    (env["src"] / "b").rename(env["src"] / "b-gone")
    forget_loaded()
    listed = json.loads(runner.invoke(data, ["list", "--json"]).output)
    # beta's sources are gone but the same recipe's build is in the cache: a snapshot
    assert listed[1]["sources"] == "snapshot" and "fixture-beta" in listed[1]["missing"]
    assert listed[1]["splits"] == {s: {"documents": v["documents"], "text_bytes": v["text_bytes"]}
                                   for s, v in summary[1]["splits"].items()}
    result = runner.invoke(data, ["build", "beta", "--force"])
    assert isinstance(result.exception, BadInput) and "apt-get install fixture-beta" in str(result.exception)
    (env["sdir"] / "beta.toml").write_text((env["sdir"] / "beta.toml").read_text().replace("version = 1", "version = 3"))
    forget_loaded()
    listed = json.loads(runner.invoke(data, ["list", "--json"]).output)
    assert listed[1]["sources"] == "missing" and listed[1]["splits"] is None


def test_snapshot_serves_a_machine_without_the_sources(env, monkeypatch):
    built = {s: S.documents("alpha", s) for s in ("train", "dev", "test")}
    (env["src"] / "a").rename(env["src"] / "a-gone")
    forget_loaded()
    assert {s: S.documents("alpha", s) for s in ("train", "dev", "test")} == built
    assert S.build("alpha")[0].snapshot
    # DRIFT_DATA_SNAPSHOT=1 pins the cached build even when the files are there but differ
    (env["src"] / "a-gone").rename(env["src"] / "a")
    (env["src"] / "a" / "doc07.txt").write_text(prose(777))
    forget_loaded()
    monkeypatch.setenv("DRIFT_DATA_SNAPSHOT", "1")
    assert {s: S.documents("alpha", s) for s in ("train", "dev", "test")} == built
    monkeypatch.delenv("DRIFT_DATA_SNAPSHOT")
    forget_loaded()
    assert {s: S.documents("alpha", s) for s in ("train", "dev", "test")} != built
    (env["src"] / "a").rename(env["src"] / "a-gone")
    # a different recipe has no snapshot: the missing package is named
    path = env["sdir"] / "alpha.toml"
    path.write_text(path.read_text().replace("version = 1", "version = 2"))
    forget_loaded()
    with pytest.raises(BadInput, match="apt-get install fixture-alpha"):
        S.documents("alpha", "test")


# ---- Hugging Face datasets (local: no hub here) ------------------------------------------------

def _hf_scenario(env, name: str, source: str) -> None:
    (env["sdir"] / f"{name}.toml").write_text(textwrap.dedent("""
        version = 1
        description = "a Hugging Face dataset"
        domain = "hf"
        [split]
        train = 0.5
        dev = 0.25
        test = 0.25
        [[sources]]
        id = "ds"
        extractor = "hf_dataset"
        licence = "CC0"
    """) + source)


def test_hf_dataset_saved_to_disk_and_json_builder(env, tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [prose(i, 40) for i in range(200)]
    datasets.Dataset.from_dict({"text": rows, "n": list(range(200))}).save_to_disk(str(tmp_path / "saved"))
    (tmp_path / "rows.json").write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
    _hf_scenario(env, "hfdisk", f'root = "{tmp_path / "saved"}"\n')
    _hf_scenario(env, "hfjson", f'root = "{tmp_path}"\ninclude = ["rows.json"]\noptions = {{ builder = "json" }}\n')
    disk = {s: S.documents("hfdisk", s) for s in ("train", "dev", "test")}
    as_json = {s: S.documents("hfjson", s) for s in ("train", "dev", "test")}
    assert all(disk[s] for s in disk)
    # the same records in the same order give the same documents (ids, and so splits, differ)
    assert sorted(d.text for v in disk.values() for d in v) == sorted(d.text for v in as_json.values() for d in v)
    joined = " ".join(d.text for d in sorted((d for v in disk.values() for d in v), key=lambda d: d.id))
    assert joined.split() == " ".join(rows).split()
    assert len(S.build_stream("hfdisk", "test", ByteTokenizer(), max_prompts=3).prompts) == 3
    m = S.build("hfdisk")[0].manifests["test"]
    assert m["sources"][0]["documents"] == len(disk["test"]) and m["sources"][0]["files"]
    _hf_scenario(env, "hfcol", f'root = "{tmp_path / "saved"}"\noptions = {{ text_field = "body" }}\n')
    with pytest.raises(BadInput, match="dataset has no column 'body' \\(columns: text, n\\)"):
        S.documents("hfcol", "test")


def test_gcide_cleaning_and_quotations():
    from drift_cli.scenarios.cleaning import clean_gcide, gcide_quotations

    entry = ('Anthrax \\An"thrax\\ ([a^]n"thr[a^]ks), n. [L. anthrax.]\n'
             "   1. (Med.) A carbuncle.\n"
             "      [1913 Webster]\n"
             "            Satan stood\n"
             "            Awhile as mute.                  --Milton.\n"
             "      [1913 Webster]\n"
             "   Syn: {Boil}.\n")
    assert clean_gcide(entry).splitlines()[:2] == ["Anthrax, n. [L. anthrax.]", "   1. (Med.) A carbuncle."]
    assert "[1913 Webster]" not in clean_gcide(entry)
    assert gcide_quotations(entry) == ["Satan stood\nAwhile as mute. --Milton."]


def test_lexical_shift_exact_values():
    import math

    from drift_cli.scenarios.document import Document
    from drift_cli.scenarios.shift import ReferenceText, lexical_shift

    doc = lambda t: Document("x:" + t[:8], t, "x", "x")  # noqa: E731
    ref = ReferenceText.of([doc("the cat sat. the dog sat")])   # words: the cat sat . the dog sat
    assert ref.total == 7 and ref.unigrams["the"] == 2
    same = lexical_shift([doc("The cat sat")], ref)
    assert (same.word_oov, same.bigram_seen) == (0.0, 1.0)
    # add-one unigram: P(w) = (count + 1) / (7 + |V| + 1), |V| = 5
    assert math.isclose(same.unigram_ce_nats, -(math.log(3 / 13) + math.log(2 / 13) + math.log(3 / 13)) / 3)  # the cat sat
    new = lexical_shift([doc("a bird flew sat")], ref)
    assert (new.word_oov, new.bigram_seen) == (0.75, 0.0)
