"""The static-cache engine path (`drift_cli.engine.graphs`): on the CPU it must decode exactly what
the eager path decodes, with the graph emulated by replays over the same static buffers. The CUDA
capture itself only runs on a GPU (benchmarks/bench_graphs.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from drift_cli.bench_config import BenchConfig
from drift_cli.devices import resolve_dtype
from drift_cli.engine import graphs
from drift_cli.engine.graphs import StaticLM, make_lm, time_forward
from drift_cli.engine.lm import CausalLM
from drift_cli.engine.loop import DecodeConfig, run_stream
from drift_cli.errors import BadInput
from drift_cli.methods.ar import Autoregressive
from drift_cli.methods.drift import DriftMethod
from drift_cli.methods.vanilla import Vanilla
from drift_cli.stream import Prompt, Stream
from tests.models import tiny_llama
from tests.pinned import MICRO_FIXTURE


@pytest.fixture(autouse=True)
def one_thread():
    """The CPU attention kernel over a masked static cache is slow with threads fighting for 2 cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def micro():
    load = lambda role: AutoModelForCausalLM.from_pretrained(str(MICRO_FIXTURE / role), dtype=torch.float32).eval()  # noqa: E731
    return load("draft"), load("target")


def _stream(vocab: int, lengths=(1, 6, 19, 3, 11), max_new: int = 14) -> Stream:
    g = torch.Generator().manual_seed(0)
    prompts = [Prompt(tuple(torch.randint(3, vocab, (n,), generator=g).tolist()), f"d{i}") for i, n in enumerate(lengths)]
    return Stream("unit", "test", prompts, max_new)


METHODS = {"ar": lambda d: Autoregressive(), "vanilla": Vanilla, "drift": DriftMethod}


def _decode(monkeypatch, mode: str, draft, target, batch: int, stream: Stream, name: str = "target"):
    monkeypatch.setenv(graphs.ENGINE_ENV, mode)
    lm = make_lm(target, name)
    cfg = DecodeConfig(gamma=3, max_new_tokens=stream.max_new_tokens, batch_size=batch)
    runs = {m: run_stream(lm, build(draft), stream, cfg) for m, build in METHODS.items()}
    return lm, runs


@pytest.mark.parametrize("batch", [1, 4])
def test_static_and_graph_paths_decode_what_the_eager_path_decodes(monkeypatch, micro, batch):
    draft, target = micro
    stream = _stream(target.config.vocab_size)
    _, eager = _decode(monkeypatch, "eager", draft, target, batch, stream)
    outputs = {m: [g.output_ids for g in r.generations] for m, r in eager.items()}
    assert outputs["vanilla"] == outputs["drift"] == outputs["ar"]
    for mode in ("static", "graph"):
        lm, runs = _decode(monkeypatch, mode, draft, target, batch, stream)
        assert isinstance(lm, StaticLM) and lm.graphs == (mode == "graph")
        for m, run in runs.items():
            assert [g.output_ids for g in run.generations] == outputs[m], (mode, m)
            # the same iterations: the same drafts accepted
            assert [s.accepted for s in run.steps] == [s.accepted for s in eager[m].steps], (mode, m)
        if mode == "graph":
            assert lm.graph_replays > 0
            assert runs["ar"].warmup_ms > 0          # the target's widths captured before ar's stream
            assert all(r.warmup_ms >= 0 for r in runs.values())
        else:
            assert lm.graph_replays == 0


@torch.inference_mode()
@pytest.mark.parametrize("mode", ["static", "graph"])
def test_logits_agree_with_the_eager_cache_through_rollbacks(micro, mode):
    _, target = micro
    ids = torch.randint(3, target.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(2))
    eager, static = CausalLM(target, "eager"), make_lm(target, f"logits-{mode}", mode)
    for lm in (eager, static):
        lm.reset()
    static.prepare((1, 2, 3, 4))
    for lo, hi, keep in [(0, 17, 17), (17, 21, 18), (18, 19, 19), (19, 23, 20), (20, 22, 22), (22, 40, 40)]:
        (he, le), (hs, ls) = eager.forward(ids[:, lo:hi]), static.forward(ids[:, lo:hi])
        torch.testing.assert_close(ls, le, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(hs, he, rtol=1e-5, atol=1e-5)
        eager.crop(keep)
        static.crop(keep)
        assert static.cache_len == eager.cache_len == keep
    if mode == "graph":
        assert static.graph_replays == 4                # the widths 4, 1, 4, 2; 17 and 18 run without a graph


@torch.inference_mode()
def test_rows_forward_matches_the_row_cache_for_a_subset_of_rows(micro):
    _, target = micro
    g = torch.Generator().manual_seed(3)
    feeds = [torch.randint(3, 300, (n,), generator=g) for n in (5, 9, 7)]
    results = {}
    for mode in ("eager", "static", "graph"):
        lm = make_lm(target, "rows", mode)
        lm.reset_rows(3)
        if mode == "graph":
            lm.prepare((1, 2, 3))
        for slot, f in enumerate(feeds):               # one-row prefills, as admissions are
            lm.forward_rows([slot], [f[:-2]])
        results[mode] = lm.forward_rows([2, 0], [feeds[2][-2:], feeds[0][-2:-1]])   # a subset, ragged
        assert [lm.row_len(s) for s in range(3)] == [4, 7, 7]
    for mode in ("static", "graph"):
        for a, b in zip(results[mode], results["eager"], strict=True):
            torch.testing.assert_close(a[:, :1], b[:, :1], rtol=1e-5, atol=1e-5)   # row 0's padding differs
            torch.testing.assert_close(a[0], b[0], rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_captured_target_features_equal_the_eager_ones(micro):
    _, target = micro
    ids = torch.randint(3, 300, (1, 12), generator=torch.Generator().manual_seed(4))
    out = {}
    for mode in ("eager", "graph"):
        lm = make_lm(target, "features", mode)
        lm.capture((1, -1))
        lm.reset()
        if mode == "graph":
            lm.prepare((3,))
        lm.forward(ids[:, :9])
        lm.forward(ids[:, 9:])
        out[mode] = lm.features.clone()
        lm.capture(())
    assert out["graph"].shape == (1, 3, 2 * target.config.hidden_size)
    torch.testing.assert_close(out["graph"], out["eager"], rtol=1e-5, atol=1e-5)


def test_the_cache_grows_past_its_reservation_and_stays_exact(monkeypatch, micro):
    draft, target = micro
    monkeypatch.setattr(graphs, "DEFAULT_USABLE", 16)
    stream = _stream(target.config.vocab_size, lengths=(30, 4), max_new=20)
    eager = run_stream(CausalLM(target, "target"), Vanilla(draft), stream, DecodeConfig(gamma=3, max_new_tokens=20))
    lm = StaticLM(target, "grow", graphs=True)
    run = run_stream(lm, Vanilla(draft), stream, DecodeConfig(gamma=3, max_new_tokens=20))
    assert [g.output_ids for g in run.generations] == [g.output_ids for g in eager.generations]
    assert lm.usable >= 50 and lm.graph_replays > 0


def test_time_forward_times_both_paths():
    model = tiny_llama(seed=5)
    for mode in ("eager", "static", "graph"):
        lm = make_lm(model, "timed", mode)
        ms = time_forward(lm, 3, reps=2, context=8)
        assert 0 < ms < 10_000
        assert lm.cache_len == 0                       # left reset
    with pytest.raises(ValueError):
        time_forward(lm, 0)


def test_engine_mode_by_device_and_variable(monkeypatch):
    monkeypatch.delenv(graphs.ENGINE_ENV, raising=False)
    assert graphs.engine_mode("cpu") == "eager" and graphs.engine_mode("cuda") == "graph"
    assert type(make_lm(tiny_llama(), "m")) is CausalLM          # the CPU default stays the eager path
    monkeypatch.setenv(graphs.ENGINE_ENV, "static")
    assert graphs.engine_mode("cuda") == "static"
    monkeypatch.setenv(graphs.ENGINE_ENV, "fast")
    with pytest.raises(BadInput, match="DRIFT_ENGINE"):
        graphs.engine_mode("cpu")


def test_dtype_auto_is_bfloat16_on_cuda_and_float32_on_the_cpu():
    assert resolve_dtype("auto", "cuda") == resolve_dtype("auto", "cuda:1") == "bfloat16"
    assert resolve_dtype("auto", "cpu") == "float32"
    assert resolve_dtype("float32", "cuda") == "float32"            # an explicit --dtype wins
    assert BenchConfig().dtype == "auto"
    assert BenchConfig(device="cpu").dtype_name == "float32"
    assert BenchConfig(device="cpu", dtype="bf16").dtype_name == "bf16"


def test_bench_help_says_what_dtype_auto_means():
    from click.testing import CliRunner

    from drift_cli.cli import cli

    text = " ".join(CliRunner().invoke(cli, ["bench", "--help"], terminal_width=200).output.split())
    assert "auto = bfloat16 on CUDA, float32 on the CPU [default: auto]" in text


def test_suite_keys_do_not_move_with_the_auto_dtype_default():
    from drift_cli.suite.spec import cell_key

    assert cell_key({"dtype": "auto", "gamma": 4}) == cell_key({"dtype": "float32", "gamma": 4})
    assert cell_key({"dtype": "bfloat16", "gamma": 4}) != cell_key({"dtype": "float32", "gamma": 4})


@pytest.mark.slow
def test_bench_on_the_graph_path_reports_warm_up_and_matches_eager(monkeypatch, tmp_path, capsys):
    import json

    from tests.models import saved_pair
    from tests.test_drift_commands import CORPUS, run_cli

    d, t = saved_pair(tmp_path / "pair")
    runs = {}
    for mode in ("eager", "graph"):
        monkeypatch.setenv(graphs.ENGINE_ENV, mode)
        code, out, err = run_cli(["bench", "--corpus", str(CORPUS), "--draft", str(d), "--target", str(t),
                                  "--methods", "vanilla,drift", "--max-prompts", "3", "--max-new-tokens", "10",
                                  "--batch-size", "2", "--no-control", "--out", str(tmp_path / mode), "--json"], capsys)
        assert code == 0, err
        runs[mode] = json.loads(out)
    eager, graph = runs["eager"], runs["graph"]
    assert graph["config"]["dtype"] == "auto" and graph["config"]["dtype_resolved"] == "float32"
    assert graph["warmup_ms"] > eager["warmup_ms"] > 0
    for name, m in graph["methods"].items():
        assert m["warmup_ms"] >= 0
        assert m["ar_match_rate"] in (None, 1.0)
        assert m["acceptance_rate"] == eager["methods"][name]["acceptance_rate"]
        assert m["tokens"] == eager["methods"][name]["tokens"] if "tokens" in m else True


def test_a_policy_warm_up_hook_runs_before_its_stream_untimed(micro):
    draft, target = micro
    calls = []

    class Warm(Vanilla):
        name = "warm"

        def warm_up(self, rows, gamma):
            calls.append((rows, gamma, len(getattr(self, "seen", []))))

    run = run_stream(CausalLM(target, "target"), Warm(draft), _stream(target.config.vocab_size, (4,), 4),
                     DecodeConfig(gamma=2, max_new_tokens=4))
    assert calls == [(1, 2, 0)] and run.warmup_ms >= 0


def test_trees_on_the_graph_path_are_refused_in_one_line(monkeypatch, tmp_path, capsys):
    from tests.models import saved_pair
    from tests.test_drift_commands import CORPUS, run_cli

    d, t = saved_pair(tmp_path / "pair")
    monkeypatch.setenv(graphs.ENGINE_ENV, "graph")
    code, out, err = run_cli(["bench", "--corpus", str(CORPUS), "--draft", str(d), "--target", str(t),
                              "--methods", "vanilla", "--max-prompts", "2", "--max-new-tokens", "6",
                              "--tree-nodes", "4", "--no-control", "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and err.strip().count("\n") == 0 and "DRIFT_ENGINE=eager" in err
