"""Families as files (rotviz.arch), weight-source adapters (rotviz.sources) and the layers
between them: discovery, the names everything imports, quirks read from the spec, random
model options, and the zoo registry as a leaf."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import rotviz.arch as arch
from rotviz.arch import (
    FAMILIES,
    SPECS,
    ArchSpec,
    Sizes,
    config_value,
    family_module,
    max_positions,
    position_offset,
    spec_for,
    spec_named,
)
from rotviz.errors import RotvizError
from rotviz.random_models import options, random_model
from rotviz.sources.adapters import SOURCES, source_of

ROOT = Path(__file__).resolve().parents[1]


def test_every_family_file_is_found_once_in_its_listed_order():
    files = sorted(p.stem for p in (ROOT / "rotviz" / "arch" / "families").glob("*.py")
                   if p.stem != "__init__")
    assert sorted(m.__name__.rsplit(".", 1)[1] for m in map(family_module, FAMILIES)) == files
    assert len(set(FAMILIES)) == len(FAMILIES) == len(SPECS) == len(files)
    assert FAMILIES == ("gpt2", "bert", "roberta", "vit", "timm-vit", "llama", "mistral", "qwen2",
                        "gemma", "gemma2", "gpt-neox", "phi3", "qwen3", "deberta-v2",
                        "olmo2", "falcon",
                        "modernbert", "distilbert", "electra")
    assert [s.family for s in SPECS] == list(FAMILIES)


def test_a_new_family_file_is_discovered(tmp_path, monkeypatch):
    """A module dropped into the families folder is a family, listed after those with ORDER."""
    import rotviz.arch.families as families

    (tmp_path / "zzz_toy.py").write_text(
        "from dataclasses import replace\n"
        "from rotviz.arch.families import bert\n"
        "SPEC = replace(bert.SPEC, family='toy', model_types=('toy',))\n"
        "def random_config(s):\n    return {}\n"
        "UNTIED = None\n")
    monkeypatch.setattr(families, "__path__", [*families.__path__, str(tmp_path)])
    try:
        found = arch._discover()
        assert [m.SPEC.family for m in found] == [*FAMILIES, "toy"]
    finally:
        sys.modules.pop("rotviz.arch.families.zzz_toy", None)


def test_public_names_keep_working():
    from rotviz.arch import BERT, GPT2, LLAMA, ROBERTA, TIMM_VIT, VIT

    assert [s.family for s in (GPT2, BERT, ROBERTA, VIT, TIMM_VIT, LLAMA)] == list(FAMILIES[:6])
    assert all(isinstance(s, ArchSpec) for s in SPECS)
    assert config_value({"model_args": {"depth": 3}}, ("depth",)) == 3
    with pytest.raises(AttributeError):
        arch.NOT_A_FAMILY  # noqa: B018
    with pytest.raises(RotvizError, match="unknown family 'nope'"):
        spec_named("nope")


def test_random_configs_are_recognised_as_their_family(family):
    spec = spec_named(family)
    config = family_module(family).random_config(Sizes())
    assert spec_for(config) is spec
    assert source_of(spec) is SOURCES[spec.source]
    assert family_module(family).UNTIED is None or isinstance(family_module(family).UNTIED, dict)


def test_unsupported_configs_are_one_line_errors_listing_every_family():
    for config, found in (({"model_type": "resnet"}, "resnet"), ({"architecture": "swin_t"},
                                                                  "swin_t"), ({}, "unknown")):
        with pytest.raises(RotvizError) as e:
            spec_for(config)
        msg = str(e.value)
        assert "\n" not in msg and f"unsupported model type '{found}'" in msg
        assert [msg.index(f"{f} (") for f in FAMILIES] == sorted(msg.index(f"{f} (")
                                                                  for f in FAMILIES)


def test_position_offset_is_read_from_the_spec(family):
    """RoBERTa counts positions from pad_token_id + 1 (its spec's positions_after); no other
    family skips any. The random model's config says as much."""
    spec = spec_named(family)
    config = family_module(family).random_config(Sizes())
    if spec.inputs == "pixels":
        return
    offset = position_offset(spec, config)
    assert offset == (config["pad_token_id"] + 1 if spec.positions_after else 0)
    assert max_positions(spec, config, 0) == 32  # random text models take 32 tokens
    assert max_positions(spec, {}, 0) == -offset
    assert max_positions(spec, {"max_position_embeddings": 40}, 0) == 40 - offset


def test_random_model_options_belong_to_their_families():
    assert options("llama") == {"kv_heads": None, "head_dim": None, "bias": False,
                                "tie_embeddings": False, "positions": 32}
    assert options("vit") == {} and options("gpt2") == {"tie": True, "positions": 32,
                                                   "scale_by_layer": False,
                                                   "reorder_upcast": False}
    with pytest.raises(ValueError,
                       match="kv_heads is an option of llama(, [a-z0-9_-]+)*, not gpt2.s"):
        random_model("gpt2", kv_heads=2)
    with pytest.raises(ValueError, match="positions is an option of .*, not vit's"):
        random_model("vit", positions=64)
    with pytest.raises(TypeError, match="unexpected keyword argument 'foo'"):
        random_model("bert", foo=1)
    random_model("vit", positions=32)  # another family's default is no error


def _modules_after(statement: str) -> list[str]:
    code = (f"import sys; {statement}; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('rotviz', 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def test_the_zoo_registry_is_a_leaf_and_arch_is_data():
    assert _modules_after("import rotviz.zoo_registry") == [
        "rotviz", "rotviz.confine", "rotviz.errors", "rotviz.user_cache", "rotviz.version",
        "rotviz.zoo_registry"]
    loaded = _modules_after("import rotviz.arch")
    assert "torch" not in loaded and not any(m.startswith("rotviz.sources") for m in loaded)


def test_an_alias_family_is_its_twin_under_other_names(saved):
    """The families the suite's `family` fixture leaves out (conftest.ALIASES) are described
    exactly as their twin but for names, and their random models hold the same tensors."""
    from dataclasses import fields

    from conftest import ALIASES

    from rotviz.sources.loading import load_model

    names = {"family", "description", "model_types"}
    for alias, twin in ALIASES.items():
        a, b = spec_named(alias), spec_named(twin)
        assert [getattr(a, f.name) for f in fields(a) if f.name not in names] == \
            [getattr(b, f.name) for f in fields(b) if f.name not in names]
        ma, mb = load_model(saved(alias)), load_model(saved(twin))
        assert {k: tuple(v.shape) for k, v in ma.state.items()} == \
            {k: tuple(v.shape) for k, v in mb.state.items()}
