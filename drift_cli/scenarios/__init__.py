"""Scenarios from real text: the public API.

    scenario_names() -> names of the scenario files
    load_scenario(name) -> Scenario                   (BadInput with "did you mean")
    documents(scenario, split) -> list[Document]      (train / dev / test, disjoint by document)
    target_training_documents()                       (train splits of every scenario)
    draft_training_documents()                        (general prose + pre-cutoff dated text)
    build_stream(scenario, split, tokenizer, max_prompts=None, variant=None, shuffle=0) -> Stream
    corpus_scenario(path) -> Scenario                 (`drift bench --corpus PATH`)

Scenario files live in `scenarios/` at the repository root ($DRIFT_SCENARIO_DIR overrides);
extracted splits are cached under $DRIFT_CACHE_DIR (default ~/.cache/drift-bench).
"""

from __future__ import annotations

import os
from pathlib import Path

from drift_cli.errors import BadInput
from drift_cli.registry import unknown
import drift_cli.scenarios.corpus  # noqa: F401  (registers the text_chunks extractor)
from drift_cli.scenarios.build import ScenarioBuild, build_scenario, forget_loaded
from drift_cli.scenarios.document import Document
from drift_cli.scenarios.schema import SPLITS, Scenario, load_scenario_file, read_toml
from drift_cli.scenarios.streams import assemble_prompts, choose_order
from drift_cli.stream import Stream

__all__ = ["Document", "Scenario", "scenario_names", "load_scenario", "documents",
           "target_training_documents", "draft_training_documents", "build_stream",
           "corpus_scenario", "build", "scenario_dir", "forget_loaded"]

DEFAULTS_FILE = "defaults.toml"


def scenario_dir() -> Path:
    env = os.environ.get("DRIFT_SCENARIO_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "scenarios"


def _defaults() -> dict:
    path = scenario_dir() / DEFAULTS_FILE
    return read_toml(path) if path.exists() else {}


def scenario_names() -> list[str]:
    root = scenario_dir()
    if not root.is_dir():
        raise BadInput(f"scenario directory {root} not found; set DRIFT_SCENARIO_DIR to the "
                       "repository's scenarios/ folder")
    return sorted(p.stem for p in root.glob("*.toml") if p.name != DEFAULTS_FILE)


def load_scenario(name: str) -> Scenario:
    names = scenario_names()
    if name not in names:
        raise unknown("scenario", name, names)
    return load_scenario_file(scenario_dir() / f"{name}.toml", _defaults())


def _resolve(scenario: str | Scenario) -> Scenario:
    return scenario if isinstance(scenario, Scenario) else load_scenario(scenario)


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise unknown("split", split, SPLITS)


def build(scenario: str | Scenario, force: bool = False) -> list[ScenarioBuild]:
    """Extract and split a scenario (its components for a mixed one); cached."""
    sc = _resolve(scenario)
    if sc.components:
        return [b for c in sc.components for b in build(c, force)]
    return [build_scenario(sc, force)]


def documents(scenario: str | Scenario, split: str) -> list[Document]:
    """A split's documents, sorted by id. Mixed scenarios return their components' union."""
    _check_split(split)
    sc = _resolve(scenario)
    docs: dict[str, Document] = {}
    for b in build(sc):
        for d in b.splits[split]:
            docs.setdefault(d.id, d)
    return [docs[k] for k in sorted(docs)]


def _leaf_scenarios() -> list[Scenario]:
    return [sc for sc in map(load_scenario, scenario_names()) if not sc.components]


def target_training_documents() -> list[Document]:
    """The train split of every scenario (mixed scenarios add nothing new)."""
    docs: dict[str, Document] = {}
    for sc in _leaf_scenarios():
        for d in documents(sc, "train"):
            docs.setdefault(d.id, d)
    return [docs[k] for k in sorted(docs)]


def draft_training_documents() -> list[Document]:
    """What the zoo's draft may learn from: the train split of scenarios marked
    draft_data = "train" (general prose) and the pre-cutoff part of those marked "pre_cutoff"."""
    docs: dict[str, Document] = {}
    for sc in _leaf_scenarios():
        if sc.draft_data == "none":
            continue
        for d in documents(sc, "train"):
            if sc.draft_data == "pre_cutoff" and not (d.date and d.date < sc.split.cutoff):
                continue
            docs.setdefault(d.id, d)
    return [docs[k] for k in sorted(docs)]


def build_stream(scenario: str | Scenario, split: str, tokenizer, max_prompts: int | None = None,
                 variant: str | None = None, shuffle: int = 0) -> Stream:
    """The prompt stream of a split: `prompts[split]` windows (or max_prompts) of
    prompt_tokens tokens each, in the scenario's order (or the named variant).

    shuffle N > 0 draws stream shuffle N: the same split's documents, ordered (and so chosen,
    when the stream is shorter than the split) by another salted hash. Shuffles are independent
    repeats of one workload (the claims suite's CIs); 0 is the scenario's own stream."""
    _check_split(split)
    sc = _resolve(scenario)
    if max_prompts is not None and max_prompts <= 0:
        raise BadInput(f"--max-prompts must be a positive integer, got {max_prompts}")
    order = choose_order(sc.stream, variant, sc.name)
    n = max_prompts if max_prompts is not None else sc.stream.prompts_for(split)
    docs = documents(sc, split)
    salt = f"{sc.split.salt}/{sc.name}/{split}" + (f"/shuffle-{shuffle}" if shuffle else "")
    prompts = assemble_prompts(docs, tokenizer, sc.stream, order, n, salt)
    if not prompts:
        raise BadInput(f"scenario '{sc.name}': the {split} split has no document long enough for a "
                       f"{sc.stream.prompt_tokens}-token prompt")
    domains: dict[str, int] = {}
    for p in prompts:
        domains[p.domain] = domains.get(p.domain, 0) + 1
    meta = {"scenario_version": sc.version, "order": order, "prompt_tokens": sc.stream.prompt_tokens,
            "recipe_sha256": sc.recipe_sha256(), "documents_in_split": len(docs),
            "documents_used": len({p.doc_id for p in prompts}), "domains": domains,
            "requested_prompts": n, "shuffle": shuffle,
            # sha256 of each (component) scenario's split file: the exact data behind the stream
            "split_sha256": {b.scenario.name: b.manifests[split]["sha256"] for b in build(sc)},
            "snapshot": any(b.snapshot for b in build(sc))}
    return Stream(scenario=sc.name, split=split, prompts=prompts,
                  max_new_tokens=sc.stream.max_new_tokens, meta=meta)


def corpus_scenario(path: str | Path, **kwargs) -> Scenario:
    """An ad-hoc shifted scenario from the user's text file, directory or JSONL file."""
    from drift_cli.scenarios.corpus import corpus_scenario as _corpus

    return _corpus(path, _defaults(), **kwargs)
