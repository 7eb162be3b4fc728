"""The shipped scenarios on this machine's real sources.

Extraction is cached under $DRIFT_CACHE_DIR (default ~/.cache/drift-bench): the first run
extracts everything (about 25 s on 2 cores), later runs read the cache. A scenario whose OS
package is missing is skipped with the BadInput message naming the package.
"""

from __future__ import annotations

import pytest

import drift_cli.scenarios as S
from drift_cli.errors import BadInput
from drift_cli.scenarios.cleaning import content_sha256, normalised_sha256

SPLITS = ("train", "dev", "test")


def _splits(name: str) -> dict:
    try:
        return {s: S.documents(name, s) for s in SPLITS}
    except BadInput as e:
        pytest.skip(str(e))


@pytest.mark.parametrize("name", S.scenario_names())
def test_train_dev_test_never_overlap(name):
    splits = _splits(name)
    for key in (lambda d: d.id, lambda d: content_sha256(d.text), lambda d: normalised_sha256(d.text)):
        seen: dict[str, str] = {}
        for split, docs in splits.items():
            for d in docs:
                k = key(d)
                assert seen.setdefault(k, split) == split, f"{name}: {d.id} in {seen[k]} and {split}"
    assert all(splits[s] for s in SPLITS), f"{name}: an empty split"


@pytest.mark.parametrize("name", S.scenario_names())
def test_test_split_feeds_a_default_stream(name):
    # enough distinct documents that the default test stream uses one window per document
    sc = S.load_scenario(name)
    docs = _splits(name)["test"]
    assert len(docs) >= sc.stream.prompts_for("test"), f"{name}: {len(docs)} test documents"


def test_draft_never_sees_a_dev_or_test_document():
    try:
        draft = S.draft_training_documents()
    except BadInput as e:
        pytest.skip(str(e))
    ids = {d.id for d in draft}
    hashes = {normalised_sha256(d.text) for d in draft}
    for name in S.scenario_names():
        for split in ("dev", "test"):
            for d in _splits(name)[split]:
                assert d.id not in ids and normalised_sha256(d.text) not in hashes, (name, split, d.id)


def test_temporal_respects_the_cutoff():
    sc = S.load_scenario("temporal")
    splits = _splits("temporal")
    cutoff = sc.split.cutoff
    for split in ("dev", "test"):
        assert splits[split] and all(d.date and d.date >= cutoff for d in splits[split])
    try:
        draft = S.draft_training_documents()
    except BadInput as e:
        pytest.skip(str(e))
    draft_temporal = [d for d in draft if d.domain == sc.domain]
    assert draft_temporal and all(d.date < cutoff for d in draft_temporal)


def test_multilingual_interleaves_languages():
    class Bytes:
        def encode(self, text, add_special_tokens=False):
            return list(text.encode())

    try:
        stream = S.build_stream("multilingual", "test", Bytes(), max_prompts=8)
    except BadInput as e:
        pytest.skip(str(e))
    assert [p.domain for p in stream.prompts] == ["man.de", "man.en", "man.es", "man.fr"] * 2
