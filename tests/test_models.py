"""Cases from a model's config: the committed configs read through transformers, their layer
specs split for tensor parallelism, the refusals, a local config, a missing transformers, the
hub offline, the case ids, the options, the grouped check, and runs of the models' suite on the CPU."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import kit
import pytest
import torch

from pytest_attnperf.families.models import cases as model_cases
from pytest_attnperf.families.models import load as model_load
from pytest_attnperf.families.models.layers import AttentionLayers, LinearLayers, layer_specs, split_kv_heads
from pytest_attnperf.options import OPTIONS, read_settings
from pytest_attnperf.plugins.pool_settings import settings_data, settings_from_data

transformers = pytest.importorskip("transformers")
import huggingface_hub.constants  # noqa: E402
from transformers import LlamaConfig, MistralConfig, Qwen3NextConfig  # noqa: E402  (loaded once, outside pytester)

pytest_plugins = ["pytester"]

TINY_SLIDING = {"model_type": "mistral", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 16,
                "num_key_value_heads": 4, "head_dim": 16, "sliding_window": 32, "intermediate_size": 128,
                "vocab_size": 100}
TINY_HYBRID = {"model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 8,
               "num_key_value_heads": 2, "head_dim": 16, "linear_num_key_heads": 8, "linear_num_value_heads": 16,
               "linear_key_head_dim": 16, "linear_value_head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
               "vocab_size": 100}


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ATTNPERF_* variable leaks in; the hub is never asked; each test reads its configs afresh."""
    for opt in OPTIONS:
        monkeypatch.delenv(opt.env, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read once, at its import
    model_load.load.cache_clear()


def specs(name: str, tp: int = 1) -> tuple[Any, ...]:
    return layer_specs(model_load.load(name).config, tp)


def tiny_folder(where: Path, name: str = "tiny-sliding", config: dict[str, Any] | None = None) -> Path:
    folder = where / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_SLIDING if config is None else config))
    return folder


# -- the committed configs ------------------------------------------------------------------------


def test_the_committed_configs_are_listed() -> None:
    assert model_load.committed() == ("llama3-8b", "mistral-7b", "qwen3-next-80b-a3b")


@pytest.mark.parametrize(("name", "cls"), [("llama3-8b", LlamaConfig), ("mistral-7b", MistralConfig),
                                           ("qwen3-next-80b-a3b", Qwen3NextConfig)])
def test_a_committed_config_is_read_by_its_transformers_class(name: str, cls: type) -> None:
    model = model_load.load(name)
    assert isinstance(model.config, cls)
    assert model.name == name


def test_llama3_8b_is_32_query_heads_over_8_kv_heads_of_128_in_32_full_layers() -> None:
    (full,) = specs("llama3-8b")
    assert full == AttentionLayers("full", tuple(range(32)), 1, 32, 8, 128, None, 1)
    assert model_load.load("llama3-8b").config.hidden_size == 4096


def test_mistral_7b_is_32_over_8_heads_with_a_4096_window_in_every_layer() -> None:
    (sliding,) = specs("mistral-7b")
    assert sliding == AttentionLayers("sliding", tuple(range(32)), 1, 32, 8, 128, 4096, 1)


def test_qwen3_next_has_full_attention_every_4th_layer_and_gated_deltanet_in_the_others() -> None:
    gdn, full = specs("qwen3-next-80b-a3b")
    assert full == AttentionLayers("full", tuple(range(3, 48, 4)), 1, 16, 2, 256, None, 1)
    assert gdn == LinearLayers("gdn", tuple(i for i in range(48) if i % 4 != 3), 1, 16, 32, 128, 128)
    assert gdn.family == "gdn"


# -- tensor parallelism ---------------------------------------------------------------------------


@pytest.mark.parametrize(("tp", "heads", "kv", "replicas"), [(1, 32, 8, 1), (2, 16, 4, 1), (4, 8, 2, 1),
                                                             (8, 4, 1, 1)])
def test_llama_and_mistral_split_query_and_kv_heads(tp: int, heads: int, kv: int, replicas: int) -> None:
    for name in ("llama3-8b", "mistral-7b"):
        (spec,) = specs(name, tp)
        assert (spec.tp, spec.heads, spec.kv_heads, spec.kv_replicas) == (tp, heads, kv, replicas)


@pytest.mark.parametrize(("tp", "full", "gdn"), [(1, (16, 1, 1), (16, 32)), (2, (8, 1, 1), (8, 16)),
                                                 (4, (4, 1, 2), (4, 8)), (8, (2, 1, 4), (2, 4)),
                                                 (16, (1, 1, 8), (1, 2))])
def test_qwen3_next_replicates_its_2_kv_heads_beyond_tp2_and_splits_gdn_heads(
        tp: int, full: tuple[int, int, int], gdn: tuple[int, int]) -> None:
    """vLLM's rule: below as many ranks as KV heads they are split; beyond, one a rank, replicated."""
    linear, attention = specs("qwen3-next-80b-a3b", tp)
    kv = 2 // tp if tp <= 2 else 1
    assert (attention.heads, attention.kv_heads, attention.kv_replicas) == (full[0], kv, full[2])
    assert (linear.key_heads, linear.value_heads, linear.key_dim, linear.value_dim) == (*gdn, 128, 128)


@pytest.mark.parametrize(("name", "tp", "message"), [
    ("llama3-8b", 3, "32 query heads do not split over 3 ranks"),
    ("llama3-8b", 64, "32 query heads do not split over 64 ranks"),
    ("qwen3-next-80b-a3b", 32, "16 linear key heads do not split over 32 ranks"),
    ("qwen3-next-80b-a3b", 3, "16 linear key heads do not split over 3 ranks"),
])
def test_a_split_that_does_not_divide_is_refused(name: str, tp: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        specs(name, tp)


def test_kv_heads_neither_split_nor_replicated_evenly_are_refused() -> None:
    assert split_kv_heads(8, 16) == (1, 2)
    with pytest.raises(ValueError, match="3 key/value heads do not split over 2 ranks"):
        split_kv_heads(3, 2)
    with pytest.raises(ValueError, match="4 key/value heads cannot be replicated evenly over 6 ranks"):
        split_kv_heads(4, 6)


def test_a_layer_type_no_family_runs_is_refused() -> None:
    config = SimpleNamespace(num_attention_heads=4, num_key_value_heads=4, head_dim=8,
                             layer_types=["full_attention", "chunked_attention"])
    with pytest.raises(ValueError, match="layer type 'chunked_attention'"):
        layer_specs(config)
    kimi = SimpleNamespace(model_type="kimi_linear", num_attention_heads=4, head_dim=8,
                           layer_types=["linear_attention"], linear_num_key_heads=4, linear_num_value_heads=4)
    with pytest.raises(ValueError, match="model type 'kimi_linear': no linear family"):
        layer_specs(kimi)


ATTENTION = dict(num_attention_heads=4, num_key_value_heads=4, head_dim=8, layer_types=["full_attention"])


@pytest.mark.parametrize(("extra", "message"), [
    (dict(kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128),
     r"multi-head latent attention \(kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128\)"),
    (dict(attn_logit_softcapping=50.0), r"soft-capped \(attn_logit_softcapping=50.0\)"),
    (dict(model_type="gpt_oss"), "attention sinks"),
    (dict(cross_attention_layers=[3, 8]), r"cross-attention layers \[3, 8\]"),
    (dict(is_encoder_decoder=True), "an encoder-decoder model"),
    (dict(model_type="bert"), r"an encoder \(model type 'bert', a masked language model, is_decoder not set\)"),
    (dict(model_type="modernbert", is_decoder=False), "an encoder .*bidirectional"),
])
def test_attention_beyond_the_softmax_family_is_refused_naming_what(extra: dict[str, Any], message: str) -> None:
    """DeepSeek's latent attention, Gemma-2's capped logits, gpt-oss's sinks, Mllama's cross-attention,
    an encoder-decoder and an encoder would otherwise read as plain causal attention of some head width."""
    with pytest.raises(ValueError, match=message):
        layer_specs(SimpleNamespace(**ATTENTION, **extra))
    assert layer_specs(SimpleNamespace(**ATTENTION, attn_logit_softcapping=None, kv_lora_rank=None))  # Gemma-3's None
    assert layer_specs(SimpleNamespace(**ATTENTION, model_type="bert", is_decoder=True))  # BERT as a causal decoder
    assert layer_specs(SimpleNamespace(**ATTENTION, model_type="llama"))


def test_query_heads_that_kv_heads_do_not_divide_are_refused() -> None:
    with pytest.raises(ValueError, match="32 query heads cannot share 6 key/value heads"):
        layer_specs(SimpleNamespace(**{**ATTENTION, "num_attention_heads": 32, "num_key_value_heads": 6}))


def test_a_config_its_own_class_refuses_is_a_model_error_naming_the_cause(tmp_path: Path) -> None:
    odd = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 30,
           "num_key_value_heads": 30}  # LlamaConfig checks that the heads divide the hidden size
    folder = tiny_folder(tmp_path, "odd", odd)
    with pytest.raises(model_load.ModelError, match=r"transformers cannot read it as a config \(\w+Error\): .*30"):
        model_load.check_models([str(folder)], [1])


def test_two_specs_whose_cases_share_a_name_are_refused(tmp_path: Path) -> None:
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
    first, second = tiny_folder(tmp_path / "a", "llama"), tiny_folder(tmp_path / "b", "llama")
    with pytest.raises(model_load.ModelError, match=r"both name their cases 'llama'"):
        model_load.check_models([str(first), str(second)], [1])
    assert model_cases.parse_prefill("128,128") == (128,)
    assert model_cases.parse_decode("2x64,2x64,1x64") == ((2, 64), (1, 64))


# -- specs: local, missing transformers, the hub --------------------------------------------------


def test_a_local_folder_and_its_config_json_are_specs(tmp_path: Path) -> None:
    folder = tiny_folder(tmp_path, "My.Model")
    for spec in (str(folder), str(folder / "config.json")):
        model = model_load.load(spec)
        assert model.name == "my_model"  # the folder's name, '.' taken out: it separates a case id's parts
        (sliding,) = layer_specs(model.config, 2)
        assert isinstance(sliding, AttentionLayers)
        assert (sliding.kind, sliding.heads, sliding.kv_heads, sliding.head_dim, sliding.window) == (
            "sliding", 8, 2, 16, 32)


def test_a_folder_without_config_json_and_an_unknown_name_are_refused(tmp_path: Path) -> None:
    with pytest.raises(model_load.ModelError, match="holds no config.json"):
        model_load.load(str(tmp_path))
    with pytest.raises(model_load.ModelError, match=r"'llama9' is no committed config \(llama3-8b, mistral-7b"):
        model_load.load("llama9")
    for path in ("./nope", "../nope/config.json", str(tmp_path / "gone"), "nope.json"):  # paths, not hub ids
        with pytest.raises(model_load.ModelError, match=f"no such file or folder: {re.escape(path)}$"):
            model_load.load(path)


def test_without_transformers_a_model_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
    with pytest.raises(model_load.ModelError, match=r"transformers, which cannot be imported .*"
                                                    r"pip install pytest-attnperf\[models\]"):
        model_load.load("llama3-8b")


def test_a_hub_id_offline_fails_saying_so() -> None:
    with pytest.raises(model_load.ModelError) as info:
        model_load.load("some-owner/some-model-that-is-not-here")
    text = str(info.value)
    assert "the Hugging Face hub could not give its config (HF_HUB_OFFLINE is set)" in text
    assert "give a local config.json or the folder holding it" in text


# -- cases ----------------------------------------------------------------------------------------


def gpu_cases(*names: str, tps: tuple[int, ...] = (1, 8), decode: str = "") -> model_cases.ModelCases:
    from pytest_attnperf.families.models.layers import all_specs

    models = [(model_load.load(n).name, all_specs(model_load.load(n).config, tps)) for n in names]
    return model_cases.build(models, model_cases.shapes(gpu=True, decode=decode))


def test_case_ids_name_model_layer_kind_degree_and_shape() -> None:
    made = gpu_cases("llama3-8b", "qwen3-next-80b-a3b")
    ids = [c.id for c in made.softmax]
    assert ids[:3] == ["llama3-8b.full.tp1.prefill-t4096", "llama3-8b.full.tp1.prefill-t16384",
                       "llama3-8b.full.tp1.train-b8-t4096"]
    assert "qwen3-next-80b-a3b.full.tp8.train-b8-t4096" in ids
    assert [c.id for c in made.linear][-1] == "qwen3-next-80b-a3b.gdn.tp8.train-b8-t4096"
    assert len(ids) == len(set(ids)) == 2 * 2 * 3


def test_every_case_id_reads_back_as_its_model_kind_degree_and_phase() -> None:
    """What the report's model tables read: each id ``build`` gives, split back into its parts;
    an id of the hand-picked tables is no model case."""
    made = gpu_cases("llama3-8b", "mistral-7b", "qwen3-next-80b-a3b")
    every: list[Any] = [*made.softmax, *made.linear, *made.softmax_decode, *made.linear_decode]
    assert len(every) == len(made.layers)
    for case in every:
        name = model_cases.case_name(case.id)
        model, spec = made.layers[case.id]
        assert name is not None, case.id
        assert (name.model, name.kind) == (model, spec.kind)
        assert f"{name.model}.{name.kind}.tp{name.tp}.{name.phase}-{name.shape}" == case.id
    assert model_cases.case_name("qwen3-next-80b-a3b.gdn.tp8.decode-b32") == model_cases.CaseName(
        "qwen3-next-80b-a3b", "gdn", 8, "decode", "b32")
    assert model_cases.case_name("llama3-8b.full.tp1.train-b8-t4096").phase == "train"  # type: ignore[union-attr]
    for other in ("b2-h8-t1024-d64-fp16", "b32-h32-kv8-t1-cache32k-d128-causal-bf16", "a.b.tpx.prefill-t1",
                  "a.b.tp1.warmup-t1"):
        assert model_cases.case_name(other) is None


def _model_row(case: str, kernel: str, direction: str, ms: float, *, test: str = "test_models_softmax",
               tflops: float = 100.0, mfu: float | None = 0.1, gb: float = 1000.0, bound: str = "cmp",
               roofline: float | None = 0.2) -> dict[str, Any]:
    return {"nodeid": f"pytest_attnperf/families/models/suite.py::{test}[{case}-{kernel}-{direction}]",
            "params": {"case": case, "kernel": kernel, "family": "softmax", "direction": direction, "dtype": "bf16"},
            "median_ms": ms, "tflops": tflops, "mfu": mfu, "gb_per_s": gb, "bound": bound, "roofline_frac": roofline,
            "status": "recorded"}


def test_the_report_has_a_table_per_model_of_its_layers_phases_and_kernels() -> None:
    """By degree, layer kind, phase (prefill, training, decode) and shape in numeric order; the
    roofline fraction beside the spec MFU; cases of other suites and unmeasured ones left out; no
    section without model cases."""
    from pytest_attnperf.report import models as report_models
    from pytest_attnperf.report import studies

    decode = "test_models_decode_softmax"
    cases = [
        _model_row("llama3-8b.full.tp1.decode-b32-cache8k", "sdpa-cudnn", "fwd", 0.261, test=decode,
                   tflops=2.0, mfu=0.002, gb=4117.0, bound="mem", roofline=0.97),
        _model_row("llama3-8b.full.tp1.prefill-t16384", "sdpa-flash", "fwd", 5.5, roofline=0.71),
        _model_row("llama3-8b.full.tp1.prefill-t4096", "sdpa-flash", "fwd", 0.45, roofline=None),
        _model_row("llama3-8b.full.tp1.decode-b1-cache32k", "sdpa-cudnn", "fwd", 0.04, test=decode),
        _model_row("llama3-8b.full.tp1.decode-b1-cache1536", "sdpa-cudnn", "fwd", 0.01, test=decode),  # 1.5K < 32K
        _model_row("llama3-8b.full.tp8.prefill-t4096", "sdpa-flash", "fwdbwd", 0.3),
        _model_row("qwen3-next-80b-a3b.gdn.tp1.decode-b1", "fla-fused-recurrent", "fwd", 0.0069,
                   test="test_models_decode_linear"),
        {**_model_row("llama3-8b.full.tp1.train-b8-t4096", "naive", "fwd", 1.0), "median_ms": None},
        {"nodeid": "suites/test_softmax.py::test_softmax[b2-h8-t1024-sdpa-flash-fwd]", "median_ms": 0.1,
         "params": {"case": "b2-h8-t1024", "kernel": "sdpa-flash", "direction": "fwd"}},
        {"nodeid": "suites/test_mine.py::test_mine[x.y.tp1.prefill-t1]", "median_ms": 0.1,
         "params": {"case": "x.y.tp1.prefill-t1", "kernel": "mine", "direction": "fwd"}},
    ]
    entries = report_models.rows(cases)
    assert [(e["model"], e["tp"], e["phase"], e["shape"]) for e in entries] == [
        ("llama3-8b", 1, "prefill", "t4096"), ("llama3-8b", 1, "prefill", "t16384"),
        ("llama3-8b", 1, "decode", "b1-cache1536"), ("llama3-8b", 1, "decode", "b1-cache32k"),
        ("llama3-8b", 1, "decode", "b32-cache8k"),
        ("llama3-8b", 8, "prefill", "t4096"), ("qwen3-next-80b-a3b", 1, "decode", "b1")]
    text = "\n".join(report_models.markdown(entries))
    assert text.index("### llama3-8b") < text.index("### qwen3-next-80b-a3b")
    lines = text.splitlines()
    for row in ("full | 1 | decode | b32-cache8k | sdpa-cudnn | fwd | 261.0 us | 2.0 | 0.2 | 4117 | mem | 97.0",
                "full | 1 | prefill | t16384 | sdpa-flash | fwd | 5.500 ms | 100.0 | 10.0 | 1000 | cmp | 71.0",
                "full | 1 | prefill | t4096 | sdpa-flash | fwd | 450.0 us | 100.0 | 10.0 | 1000 | cmp | -"):
        assert f"| {row} | recorded |" in lines
    assert "| gdn | 1 | decode | b1 | fla-fused-recurrent | fwd | 6.9 us |" in text
    assert report_models.markdown(report_models.rows(cases[-3:])) == []
    report = studies.build(cases, {}, {"name": "h200"})
    assert report["models"] == entries
    assert "## Models" in studies.render_md(report)
    assert "## Models" not in studies.render_md(studies.build(cases[-3:], {}, {"name": "h200"}))


def test_a_case_has_its_layers_shape_at_the_default_shapes() -> None:
    made = gpu_cases("llama3-8b", "qwen3-next-80b-a3b")
    every: list[Any] = [*made.softmax, *made.linear]
    by_id = {c.id: c for c in every}
    llama = by_id["llama3-8b.full.tp8.train-b8-t4096"]
    assert (llama.batch, llama.heads, llama.n_kv_heads, llama.seq, llama.head_dim, llama.dtype, llama.causal) == (
        8, 4, 1, 4096, 128, "bf16", True)
    assert llama.batch * llama.seq == 32 * 1024
    gdn = by_id["qwen3-next-80b-a3b.gdn.tp8.prefill-t16384"]
    # 4 value heads over 2 query/key heads a rank, as the layer has them
    assert (gdn.batch, gdn.heads, gdn.key_heads, gdn.seq, gdn.key_dim, gdn.value_dim) == (1, 4, 2, 16384, 128, 128)
    assert made.layers[gdn.id] == ("qwen3-next-80b-a3b", specs("qwen3-next-80b-a3b", 8)[0])
    whole = by_id["qwen3-next-80b-a3b.gdn.tp1.train-b8-t4096"]
    assert (whole.batch, whole.heads, whole.n_key_heads, whole.seq) == (8, 32, 16, 4096)
    assert whole.refusal("gdn") is None


def test_a_gdn_case_has_key_heads_only_where_fewer_than_its_value_heads() -> None:
    cpu = model_cases.shapes(gpu=False)
    for key_heads, value_heads, expected in ((4, 4, None), (2, 4, 2)):
        layers = LinearLayers("gdn", (0,), 1, key_heads, value_heads, 16, 16)
        (case, *_) = model_cases.build([("m", {1: (layers,)})], cpu).linear
        assert (case.heads, case.key_heads) == (value_heads, expected)


def test_decode_cases_are_one_token_over_the_cache_at_the_ranks_heads_and_one_gdn_step_per_batch() -> None:
    """At TP 1 and 8: Llama's softmax layers over 32K and 8K cached tokens at the rank's 32/4 query
    and 8/1 KV heads; Qwen3-Next's full layers (2 KV heads of 256, replicated beyond TP 2) and its
    gated DeltaNet step (16/2 key heads, 32/4 value heads a rank), one case per batch size."""
    made = gpu_cases("llama3-8b", "qwen3-next-80b-a3b")
    every: list[Any] = [*made.softmax_decode, *made.linear_decode]
    by_id: dict[str, Any] = {c.id: c for c in every}
    assert sorted(by_id) == sorted(
        [f"llama3-8b.full.tp{tp}.decode-{p}" for tp in (1, 8) for p in ("b1-cache32k", "b32-cache8k")]
        + [f"qwen3-next-80b-a3b.full.tp{tp}.decode-{p}" for tp in (1, 8) for p in ("b1-cache32k", "b32-cache8k")]
        + [f"qwen3-next-80b-a3b.gdn.tp{tp}.decode-b{b}" for tp in (1, 8) for b in (1, 32)])
    rows = {i: (c.batch, c.heads, c.n_kv_heads, c.seq, c.n_kv_seq, c.head_dim, c.causal, c.window)
            for i, c in by_id.items() if ".full." in i}
    assert rows["llama3-8b.full.tp1.decode-b1-cache32k"] == (1, 32, 8, 1, 32768, 128, True, None)
    assert rows["llama3-8b.full.tp8.decode-b32-cache8k"] == (32, 4, 1, 1, 8192, 128, True, None)
    assert rows["qwen3-next-80b-a3b.full.tp8.decode-b32-cache8k"] == (32, 2, 1, 1, 8192, 256, True, None)
    gdn = by_id["qwen3-next-80b-a3b.gdn.tp8.decode-b32"]
    assert (gdn.batch, gdn.heads, gdn.key_heads, gdn.seq, gdn.key_dim, gdn.value_dim, gdn.dtype) == (
        32, 4, 2, 1, 128, 128, "bf16")
    assert by_id["qwen3-next-80b-a3b.gdn.tp1.decode-b1"].n_key_heads == 16
    assert made.layers[gdn.id] == ("qwen3-next-80b-a3b", specs("qwen3-next-80b-a3b", 8)[0])
    from pytest_attnperf.families import parametrize

    parametrize.check_cases("models", made.softmax_decode)
    parametrize.check_cases("models", made.linear_decode)


def test_a_decode_window_shorter_than_the_cache_is_kept_and_none_builds_no_decode_case() -> None:
    by_id = {c.id: c for c in gpu_cases("mistral-7b", tps=(1,)).softmax_decode}
    assert by_id["mistral-7b.sliding.tp1.decode-b1-cache32k"].window == 4096
    off = gpu_cases("mistral-7b", tps=(1,), decode="none")
    assert (off.softmax_decode, off.linear_decode) == ((), ())
    assert off.softmax
    short = gpu_cases("mistral-7b", tps=(1,), decode="4x2048")
    assert [(c.id, c.window) for c in short.softmax_decode] == [("mistral-7b.sliding.tp1.decode-b4-cache2k", None)]


def test_a_window_shorter_than_the_sequence_is_kept_and_a_longer_one_dropped() -> None:
    by_id = {c.id: c for c in gpu_cases("mistral-7b", tps=(1,)).softmax}
    assert by_id["mistral-7b.sliding.tp1.prefill-t16384"].window == 4096
    assert by_id["mistral-7b.sliding.tp1.prefill-t4096"].window is None  # 4096 keys back: every key of 4096


def test_model_cases_pass_the_tables_checks() -> None:
    from pytest_attnperf.families import parametrize

    made = gpu_cases("llama3-8b", "mistral-7b", "qwen3-next-80b-a3b", tps=(1, 2, 4, 8))
    parametrize.check_cases("models", made.softmax)
    parametrize.check_cases("models", made.linear)


def test_shapes_default_by_device_and_parse_what_is_given() -> None:
    assert model_cases.shapes(gpu=True) == model_cases.Shapes((4096, 16384), ((8, 4096),), "bf16", True,
                                                              ((1, 32768), (32, 8192)))
    assert model_cases.shapes(gpu=False) == model_cases.Shapes((128,), ((2, 64),), "fp32", False, ((2, 64),))
    given = model_cases.shapes("1024, 2048", "none", gpu=True, decode="none")
    assert (given.prefill, given.train, given.decode) == ((1024, 2048), (), ())
    assert model_cases.parse_train("4x8192,2x16384") == ((4, 8192), (2, 16384))
    assert model_cases.parse_decode("1x131072, 32x1024") == ((1, 131072), (32, 1024))
    for bad, message in (("4096x", "sequence length '' is not a whole number"), ("8", "'8' is not BATCHxSEQ")):
        with pytest.raises(ValueError, match=message):
            model_cases.parse_train(bad)
    for bad, message in (("32x0", "cache length '0' must be at least 1"), ("32", "'32' is not BATCHxCACHE")):
        with pytest.raises(ValueError, match=message):
            model_cases.parse_decode(bad)
    with pytest.raises(ValueError, match="must be at least 1"):
        model_cases.parse_prefill("0")


def test_a_softmax_case_with_one_key_has_no_backward_direction() -> None:
    """A model's one-token prefill (``--attnperf-model-prefill=1``) or a project's own table may
    hold such a case: its fwd runs, its fwdbwd is removed with the reason (SDPA's correct dq there,
    the rounding of ``dp - rowsum(dO o O)``, failed: 9.86e-07 against a bound of 1.4e-45)."""
    from pytest_attnperf.families import parametrize
    from pytest_attnperf.families.registry import Kernel
    from pytest_attnperf.families.softmax.kernels import SoftmaxCase

    assert model_cases.parse_prefill("1") == (1,)
    kernel = Kernel("softmax", "mine", len)
    one = SoftmaxCase("b2-h4-t1-d64-fp32", 2, 4, 1, 64, "fp32", True, gpu=False)
    two = SoftmaxCase("b2-h4-t2-d64-fp32", 2, 4, 2, 64, "fp32", True, gpu=False)
    assert parametrize.invalid_reason({"case": one, "kernel": kernel, "direction": "fwd"}) is None
    why = parametrize.invalid_reason({"case": one, "kernel": kernel, "direction": "fwdbwd"})
    assert why is not None
    assert "one key per query" in why
    assert parametrize.invalid_reason({"case": two, "kernel": kernel, "direction": "fwdbwd"}) is None


# -- options --------------------------------------------------------------------------------------


def settings(pytester: pytest.Pytester, *args: str) -> Any:
    return read_settings(pytester.parseconfig(*kit.PLUGIN, *args))


def test_models_are_repeatable_comma_separated_and_local_paths_made_absolute(pytester: pytest.Pytester) -> None:
    tiny_folder(pytester.path)
    s = settings(pytester, "--attnperf-model=llama3-8b,tiny-sliding", "--attnperf-model=qwen3-next-80b-a3b",
                 "--attnperf-tp=1,8,8")
    assert s.models == ("llama3-8b", str(pytester.path / "tiny-sliding"), "qwen3-next-80b-a3b")
    assert s.tp == (1, 8)
    assert settings_from_data(settings_data(s), pytester.path / "out").models == s.models  # a pool run's too
    assert settings_from_data(settings_data(s), pytester.path / "out").tp == (1, 8)


def test_models_from_the_environment_and_the_ini_file(pytester: pytest.Pytester,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeini("[pytest]\nattnperf_models = mistral-7b\nattnperf_tp = 2\n")
    assert (settings(pytester).models, settings(pytester).tp) == (("mistral-7b",), (2,))
    monkeypatch.setenv("ATTNPERF_MODELS", "llama3-8b")
    assert settings(pytester).models == ("llama3-8b",)
    assert settings(pytester, "--attnperf-model=qwen3-next-80b-a3b").models == ("qwen3-next-80b-a3b",)


def test_no_model_by_default_and_bad_values_name_their_source(pytester: pytest.Pytester) -> None:
    s = settings(pytester)
    assert (s.models, s.tp, s.model_prefill, s.model_train) == ((), (1,), "", "")
    for args, message in ((("--attnperf-tp=0",), "bad value '0' from --attnperf-tp: '0' is not a tensor-parallel"),
                          (("--attnperf-model=llama3-8b", "--attnperf-model-train=8"), "'8' is not BATCHxSEQ"),
                          (("--attnperf-model=llama3-8b", "--attnperf-model-prefill=4k"), "'4k' is not a whole")):
        with pytest.raises(pytest.UsageError, match=message):
            settings(pytester, *args)


# -- the grouped check ----------------------------------------------------------------------------


def _grouped(fn: Any, heads: int = 4, kv: int = 2, batch: int = 2) -> Any:
    from pytest_attnperf.families.models import grouped
    from pytest_attnperf.families.registry import Kernel
    from pytest_attnperf.families.softmax.kernels import SoftmaxCase

    case = SoftmaxCase("g", batch, heads, 48, 16, "fp32", True, kv_heads=kv, window=24)
    return grouped.run_grouped(Kernel("softmax", "k", fn), case, "fwdbwd", torch.device("cpu"))


def test_the_grouped_check_passes_a_correct_kernel_and_returns_the_call_to_time() -> None:
    from pytest_attnperf.families.softmax.kernels import naive, sdpa_dense_window

    for fn in (naive, sdpa_dense_window):
        timed = _grouped(fn)
        out = timed()
        assert tuple(out[0].shape) == (2, 4, 48, 16)


def test_the_grouped_check_fails_a_kernel_wrong_in_the_last_group_only() -> None:
    """The last batch entry's last group is checked, its key/value gradients summed over the group."""
    from pytest_attnperf.families.checks import CheckFailed
    from pytest_attnperf.families.softmax.kernels import naive

    def last_head_scaled(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: int | None = None) -> Any:
        out = naive(q, k, v, causal=causal, scale=scale, window=window)
        bump = q.new_ones(q.shape[0], q.shape[1], 1, 1)
        bump[-1, -1] = 1.01
        return out * bump

    def wrong_group(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: int | None = None) -> Any:
        return naive(q, k.flip(1), v.flip(1), causal=causal, scale=scale, window=window)  # groups swapped

    for fn in (last_head_scaled, wrong_group):
        with pytest.raises(CheckFailed):
            _grouped(fn)


# -- the models' suite on the CPU -----------------------------------------------------------------

WRONG_KERNEL = '''

def pytest_attnperf_register_kernels(registry, config):
    from pytest_attnperf.families.softmax.kernels import naive

    @registry.kernel(family="softmax", name="mine-off-by-2pc")
    def off(q, k, v, *, causal, scale, window=None):
        return naive(q, k, v, causal=causal, scale=scale, window=window) * 1.02
'''


def test_the_models_suite_checks_times_and_records_model_cases(pytester: pytest.Pytester) -> None:
    """On the CPU at TP 8: Llama-3-8B and a local sliding config through the softmax family (a
    project's own wrong kernel joins and fails), Qwen3-Next's full attention (head dim 256), and a
    local hybrid's gated DeltaNet layers through fla's naive recurrence; every passing case is
    recorded under its model id."""
    kit.make_project(pytester, kit.conftest("cpu") + WRONG_KERNEL)
    tiny_folder(pytester.path)
    tiny_folder(pytester.path, "tiny-hybrid", TINY_HYBRID)
    result = pytester.runpytest(
        *kit.PLUGIN, "--attnperf-model=llama3-8b,tiny-sliding", "--attnperf-model=qwen3-next-80b-a3b,tiny-hybrid",
        "--attnperf-tp=8", "--attnperf-model-train=none", "--update-baselines", "--attnperf-ceilings=off",
        "--attnperf-report=report", "-p", "no:randomly", "-rA", "-W", "ignore::UserWarning",
        "-k", "(llama3 and (sdpa-flash or mine)) or (tiny-sliding and (dense or mine)) or (tiny-hybrid and gdn) "
              "or (qwen and full and sdpa-math and fwd and not fwdbwd)")
    got = kit.outcomes(result)
    prefix = "pytest_attnperf/families/models/suite.py::"
    assert got[f"{prefix}test_models_softmax[llama3-8b.full.tp8.prefill-t128-sdpa-flash-fwdbwd]"] == "PASSED"
    assert got[f"{prefix}test_models_softmax[tiny-sliding.sliding.tp8.prefill-t128-sdpa-dense-window-fwd]"] == "PASSED"
    assert got[f"{prefix}test_models_softmax[qwen3-next-80b-a3b.full.tp8.prefill-t128-sdpa-math-fwd]"] == "PASSED"
    assert got[f"{prefix}test_models_linear[tiny-hybrid.gdn.tp8.prefill-t128-fla-naive-fwdbwd]"] == "PASSED"
    # the decode phase: one token over a cache of 64 keys, one recurrent step from a state
    assert got[f"{prefix}test_models_decode_softmax[llama3-8b.full.tp8.decode-b2-cache64-sdpa-flash-fwd]"] == "PASSED"
    assert got[f"{prefix}test_models_decode_linear[tiny-hybrid.gdn.tp8.decode-b2-torch-recurrent-fwd]"] == "PASSED"
    failed = sorted(k for k, v in got.items() if v == "FAILED")
    assert failed == sorted(
        [f"{prefix}test_models_softmax[{c}.prefill-t128-mine-off-by-2pc-{d}]"
         for c in ("llama3-8b.full.tp8", "tiny-sliding.sliding.tp8") for d in ("fwd", "fwdbwd")]
        + [f"{prefix}test_models_decode_softmax[{c}.decode-b2-cache64-mine-off-by-2pc-fwd]"
           for c in ("llama3-8b.full.tp8", "tiny-sliding.sliding.tp8")])
    recorded = kit.entries(pytester, "cpu")
    passed = {k for k, v in got.items() if v == "PASSED"}
    assert len(passed) == 11
    assert passed <= set(recorded)
    # the report's model tables: every measured case, under its model, degree, kind and phase
    tables = json.loads((pytester.path / "report" / "report.json").read_text())["models"]
    assert sorted(r["nodeid"] for r in tables) == sorted(passed)
    assert {(r["model"], r["tp"], r["kind"], r["phase"]) for r in tables if r["model"] == "tiny-hybrid"} == {
        ("tiny-hybrid", 8, "gdn", "prefill"), ("tiny-hybrid", 8, "gdn", "decode")}
    assert "### tiny-sliding" in (pytester.path / "report" / "report.md").read_text()


def test_a_split_that_does_not_divide_is_a_usage_error_of_the_run(pytester: pytest.Pytester) -> None:
    kit.make_project(pytester, kit.conftest("cpu"))
    result = pytester.runpytest(*kit.PLUGIN, "--attnperf-model=llama3-8b", "--attnperf-tp=3", "--co", "-q")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*attnperf: --attnperf-model llama3-8b at --attnperf-tp=3: 32 query heads do not "
                                 "split over 3 ranks*"])


def test_without_a_model_the_models_suite_is_not_collected(pytester: pytest.Pytester,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """And the plugin needs no transformers then; a model without it is a usage error with the fix."""
    monkeypatch.setitem(sys.modules, "transformers", None)
    kit.make_project(pytester, kit.conftest("cpu"), test_mine="def test_mine():\n    pass\n")
    result = pytester.runpytest(*kit.PLUGIN, "--attnperf-suites=all", "--co", "-q")
    assert result.ret == pytest.ExitCode.OK
    assert not any("families/models" in line for line in result.stdout.lines)
    result = pytester.runpytest(*kit.PLUGIN, "--attnperf-model=llama3-8b", "--co", "-q")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*transformers, which cannot be imported*pip install pytest-attnperf[[]models]*"])


def test_on_a_gpu_the_default_shapes_are_collected_and_kernels_that_cannot_hold_them_removed(
        pytester: pytest.Pytester) -> None:
    kit.make_project(pytester, kit.conftest("h200"))
    result = pytester.runpytest(*kit.PLUGIN, "--attnperf-model=llama3-8b", "--co", "-q")
    ids = [line.split("::")[-1] for line in result.stdout.lines if "::" in line]
    assert "test_models_softmax[llama3-8b.full.tp1.prefill-t16384-sdpa-cudnn-fwdbwd]" in ids
    assert "test_models_softmax[llama3-8b.full.tp1.prefill-t4096-naive-fwd]" in ids  # 11 GB of scores
    assert not any("t16384-naive" in i or "train-b8-t4096-sdpa-math" in i for i in ids)
    assert "test_models_linear[no-linear-attention-layers]" in ids
    assert {"test_models_decode_softmax[llama3-8b.full.tp1.decode-b32-cache8k-sdpa-cudnn-fwd]",
            "test_models_decode_softmax[llama3-8b.full.tp1.decode-b1-cache32k-naive-fwd]",
            "test_models_decode_linear[no-linear-attention-decode-layers]"} <= set(ids)
    assert not any("decode" in i and i.endswith("fwdbwd]") for i in ids)  # serving runs no backward
    result.stdout.fnmatch_lines(["*naive: materialises T x T scores: about 172 GB at B=1 H=32 T=16384*"])


def _refusing(exc: Exception) -> Any:
    import warnings

    from pytest_attnperf.families.models.suite import _refusing_plainly
    from pytest_attnperf.families.registry import Kernel

    def fn(q: Any, k: Any, v: Any, **kwargs: Any) -> Any:
        warnings.warn("Flash attention requires the last dimension to be at most 256", UserWarning, stacklevel=1)
        raise exc

    return _refusing_plainly(Kernel("softmax", "sdpa-flash", fn, sdpa_backend="flash")).fn


def test_an_sdpa_backend_without_a_kernel_for_a_shape_refuses_it_quoting_torch() -> None:
    q = torch.zeros(1, 2, 8, 512)
    with pytest.raises(NotImplementedError, match=r"SDPA flash takes no such shape \(q \(1, 2, 8, 512\)\): "
                                                  "Flash attention requires the last dimension to be at most 256"):
        _refusing(RuntimeError("No available kernel. Aborting execution."))(q, q, q)
    with pytest.raises(RuntimeError, match="CUDA error"):  # anything else stays a failure
        _refusing(RuntimeError("CUDA error: illegal memory access"))(q, q, q)


@pytest.mark.parametrize(("memory", "gpu", "why"), [
    (23.0, False, "50% of the 23 GB of this machine's host memory"),
    (24.0, True, "50% of the 24 GB of this machine's GPU"),
    (141.0, True, "40 GB"),
    (None, True, "40 GB"),
])
def test_kernels_holding_the_scores_are_capped_by_the_machines_memory(
        monkeypatch: pytest.MonkeyPatch, memory: float | None, gpu: bool, why: str) -> None:
    """A naive kernel's scores (about 38 GB here) on a machine with less memory would be killed or
    fail out of memory: a machine's limit, not the kernel's fault, so the case is not offered."""
    from pytest_attnperf.families import builtin
    from pytest_attnperf.families.models import suite as models_suite
    from pytest_attnperf.families.registry import KernelRegistry
    from pytest_attnperf.families.softmax.kernels import SoftmaxCase

    monkeypatch.setattr(models_suite, "memory_gb", lambda on_gpu: memory)
    registry = KernelRegistry()
    builtin.register_builtin(registry)
    naive = next(k for k in models_suite._softmax_kernels(registry) if k.name == "naive")
    case = SoftmaxCase("m.full.tp1.prefill-t8192", 1, 28, 8192, 128, "bf16" if gpu else "fp32", True, kv_heads=4,
                       gpu=gpu)
    assert models_suite.scores_gb(case) == pytest.approx(37.6, abs=0.1)
    said = naive.supports(case)
    if why == "40 GB":
        assert said is None
    else:
        assert said is not None
        assert said.endswith(f"(model cases cap it at {why})")
