"""mergekit, the field's reference merger, merges rotviz's matched pair from the YAML that
`rotviz merge --mergekit-config` writes, and its output equals rotviz's own merge of the same
pair, tensor by tensor (1e-5).

The pair is a tiny seeded LLaMA (or GPT-2: architectures mergekit knows by their tensor
names), matched data-free (seed); a base, where the method takes one, is a third seeded
model. Each row of ROWS is one rotviz method with its parameters and weight, run through the
command line, whose --out is the reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rotviz.cli import main
from rotviz.errors import RotvizError
from rotviz.merging.mergekit import matched_folder, mergekit_config, table
from rotviz.random_models import save_random

mergekit = pytest.importorskip("mergekit", reason="mergekit==0.1.5 (the dev extra)")

TOL = 1e-5
SIZES = dict(layers=2, d=32, heads=4, ffn=64, vocab=98, positions=64)  # the text data's 98


@dataclass(frozen=True)
class Row:
    method: str  # rotviz's method name
    weight: float
    options: tuple[str, ...] = ()  # its parameters, as command-line options
    at_size: bool = False  # --max-memory 0: matched streamed, the merge built block by block
    base: bool = False  # --base: a third seeded model of the pair's architecture
    family: str = "llama"

    @property
    def id(self) -> str:
        return "-".join([self.method, *(["at-size"] if self.at_size else []), self.family])


# Every method mergekit has, deterministic: TIES trims by magnitude; DARE keeps everything at
# density 1 (its drops are each tool's own random numbers), rescaled as mergekit does (l1).
ROWS = [
    Row("simple", 0.3),
    Row("simple", 0.3, at_size=True),  # the matched source copied from the streamed match
    Row("simple", 0.3, family="gpt2"),  # the output head tied to the embedding
    Row("slerp", 0.3),
    Row("task_arithmetic", 0.3, ("--scale", "0.8"), base=True),
    Row("ties", 0.3, ("--density", "0.5", "--scale", "1.2"), base=True),
    Row("dare_linear", 0.3, ("--density", "1", "--rescale", "l1", "--scale", "0.9"),
        base=True),
    Row("dare_ties", 0.3, ("--density", "1", "--rescale", "none"), base=True),
    Row("model_stock", 0.5, base=True),  # mergekit's plain mean: rotviz's at weight 0.5
    # Breadcrumbs cut by magnitude (deterministic); DELLA keeps everything at density 1
    Row("breadcrumbs", 0.3, ("--density", "0.6", "--gamma", "0.05", "--scale", "0.9"),
        base=True),
    Row("breadcrumbs_ties", 0.3, ("--density", "0.7", "--gamma", "0.02"), base=True),
    Row("breadcrumbs_ties", 0.3, ("--density", "0.7", "--gamma", "0.02"), at_size=True,
        base=True),
    Row("della", 0.3, ("--density", "1", "--epsilon", "0.1", "--rescale", "l1", "--scale",
                       "1.1"), base=True),
    Row("della_linear", 0.3, ("--density", "1", "--rescale", "none"), base=True),
    Row("nuslerp", 0.3),  # the whole tensors flattened (mergekit's default)
    Row("nuslerp", 0.3, ("--nuslerp-flatten", "no", "--nuslerp-row-wise", "yes"), base=True),
    Row("nuslerp", 0.3, ("--nuslerp-flatten", "no"), at_size=True),  # row by row
    Row("multislerp", 0.3),
    Row("multislerp", 0.3, base=True, at_size=True),
    Row("karcher", 0.5, ("--karcher-max-iter", "20")),  # mergekit's equal weights
    Row("karcher", 0.5, ("--karcher-tol", "1e-6"), at_size=True),
    # mergekit's sce, ram, nearswap and arcee_fusion take no weights (written at 0.5)
    Row("sce", 0.5, ("--select-topk", "0.5"), base=True),
    Row("sce", 0.5, ("--select-topk", "0.5"), base=True, at_size=True),
    Row("ram", 0.5, ("--ram-epsilon", "0.01"), base=True),
    Row("ramplus_tl", 0.5, ("--ramplus-r", "0.5", "--ramplus-alpha", "0.8", "--ram-epsilon",
                            "0.03"), base=True, at_size=True),  # unique entries: a gain
    Row("nearswap", 0.5, ("--nearswap-t", "0.05",)),
    Row("arcee_fusion", 0.5),
    Row("arcee_fusion", 0.5, at_size=True),  # slices written in the shapes they were read
    # layer stacking: four blocks (a0, b0, b1, a1), mergekit's `slices:`; starting and ending
    # with the anchor's, both tools take its embeddings, final norm and head
    Row("passthrough", 0.5, ("--slices", "a:0-1,b:0-2,a:1-2")),
]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """pairs(family): the anchor, the source, the text data, and the source as `rotviz match`
    matches it (made once per family)."""
    root = tmp_path_factory.mktemp("mergekit")
    text = root / "t.txt"
    gen = torch.Generator().manual_seed(0)
    letters = "abcdefgh "
    text.write_text("\n".join("".join(letters[int(i)] for i in torch.randint(0, 9, (40,),
                                                                              generator=gen))
                              for _ in range(40)))
    made: dict[str, tuple] = {}

    def get(family: str = "llama"):
        if family not in made:
            a = save_random(family, root / family / "anchor", seed=0, **SIZES)
            b = save_random(family, root / family / "source", seed=1, **SIZES)
            out = root / family / "matched"
            assert main(["match", str(a), str(b), "--out", str(out), "--device", "cpu"]) == 0
            made[family] = a, b, f"text:{text}", out
        return made[family]

    return get


@pytest.fixture
def pair(pairs):
    return pairs("llama")


def _mergekit(config: Path, out: Path) -> dict[str, torch.Tensor]:
    import yaml
    from mergekit.config import MergeConfiguration
    from mergekit.merge import run_merge
    from mergekit.options import MergeOptions

    cfg = MergeConfiguration.model_validate(yaml.safe_load(config.read_text()))
    run_merge(cfg, str(out), MergeOptions(cuda=False, copy_tokenizer=False, lazy_unpickle=False,
                                          quiet=True, write_model_card=False, random_seed=0))
    return load_file(out / "model.safetensors")


def _state(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_mergekit_merges_as_rotviz(pairs, tmp_path, row: Row):
    a, b, data, matched = pairs(row.family)
    config, ours = tmp_path / "merge.yaml", tmp_path / "ours"
    base = ["--base", str(save_random(row.family, tmp_path / "base", seed=2, **SIZES))] \
        if row.base else []
    assert main(["merge", str(a), str(b), "--data", data, "--device", "cpu", "--method",
                 row.method, "--weight", str(row.weight), *row.options, *base, "--out",
                 str(ours), "--mergekit-config", str(config),
                 *(["--max-memory", "0"] if row.at_size else [])]) == 0
    expected = _state(ours)
    # the matched source written for mergekit is the one `rotviz match` writes, to float32
    # rounding: streamed, of the streamed solve; in memory, of the loader (`rotviz match` reads
    # the pair through rotviz.sources.plain_torch, a merge that writes a record's extra files
    # through transformers: GPT-2's matched weights differ by 3.7e-7, the others' by nothing)
    beside, alone = _state(matched_folder(config)), _state(matched)
    assert beside.keys() == alone.keys()
    off = max((beside[k] - alone[k]).abs().max().item() for k in alone)
    assert off <= (TOL if row.at_size else 1e-6), off
    theirs = _mergekit(config, tmp_path / "theirs")
    assert theirs.keys() == expected.keys()
    worst = max((theirs[k].double() - expected[k].double()).abs().max().item() for k in theirs)
    print(f"{row.id}: mergekit - rotviz max |diff| {worst:.2e}")
    assert worst < TOL, f"{row.id}: mergekit differs from rotviz by {worst:.2e}"
    if row.method == "passthrough":  # a copy of tensors: bit for bit
        assert all(torch.equal(theirs[k], expected[k]) for k in theirs)
    # and the merge is not the anchor (the weight and the method took effect)
    anchor = _state(a)
    assert max((theirs[k] - anchor[k]).abs().max().item() for k in anchor) > 1e-2


def test_the_yaml_says_what_rotviz_does(pair, tmp_path):
    """The simple average is mergekit's linear with weights 1 - w and w (normalised: they sum
    to 1); SLERP's t is the source's weight and its base the anchor; the methods about a
    base name it; DARE's paper rescaling, which mergekit has no switch for, is refused."""
    import yaml

    a, _, _, matched = pair
    base = Path("/models/base")
    lin = yaml.safe_load(mergekit_config("simple", {}, 0.25, a, matched))
    assert lin["merge_method"] == "linear" and lin["parameters"] == {"normalize": True}
    assert [m["parameters"]["weight"] for m in lin["models"]] == [0.75, 0.25]
    assert [m["model"] for m in lin["models"]] == [str(a), str(matched)]
    sl = yaml.safe_load(mergekit_config("slerp", {}, 0.25, a, matched))
    assert sl["base_model"] == str(a) and sl["parameters"] == {"t": 0.25}
    ties = yaml.safe_load(mergekit_config("ties", {"density": 0.4, "scale": 0.8,
                                                   "consensus": "sum"}, 0.5, a, matched,
                                          base=base))
    assert ties["base_model"] == str(base)
    assert ties["parameters"] == {"normalize": True, "lambda": 0.8}
    assert [m["parameters"] for m in ties["models"]] == [{"weight": 0.5, "density": 0.4}] * 2
    dare = yaml.safe_load(mergekit_config("dare_linear", {"density": 1.0, "rescale": "l1",
                                                          "seed": 3}, 0.5, a, matched,
                                          base=base))
    assert dare["parameters"] == {"normalize": False, "rescale": True}  # seed: --random-seed
    assert [m["parameters"] for m in dare["models"]] == [{"weight": 0.5, "density": 1.0}] * 2
    with pytest.raises(RotvizError, match="--rescale density has no mergekit equivalent"):
        mergekit_config("dare_linear", {"rescale": "density"}, 0.5, a, matched, base=base)
    with pytest.raises(RotvizError, match="--consensus count has no mergekit equivalent"):
        mergekit_config("ties", {"consensus": "count"}, 0.5, a, matched, base=base)
    with pytest.raises(RotvizError, match="about a base model: give --base"):
        mergekit_config("model_stock", {}, 0.5, a, matched)
    with pytest.raises(RotvizError, match="plain mean of the models"):
        mergekit_config("model_stock", {}, 0.3, a, matched, base=base)
    # every method whose record names a mergekit equivalent has a row here
    assert {r.method for r in ROWS} == set(table())


@pytest.mark.parametrize("method", ["fisher", "regmean"])
def test_methods_without_mergekit_are_refused_first(pair, tmp_path, capsys, method):
    """Refused in one line naming the methods that have one, before any model is read."""
    a, b, data, _ = pair
    rc = main(["merge", str(a), str(b), "--data", data, "--method", method,
               "--mergekit-config", str(tmp_path / "m.yaml")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert f"--method {method} has no mergekit equivalent" in err and "simple" in err
    assert not (tmp_path / "m.yaml").exists() and not (tmp_path / "m-matched").exists()


def test_the_yaml_is_an_output_like_any_other(pair, tmp_path, capsys):
    """Stamped as rotviz's, so --overwrite replaces it (and its matched folder); without
    --overwrite, or over a file rotviz did not write, it is refused before any work."""
    a, b, data, _ = pair
    config = tmp_path / "merge.yaml"
    cmd = ["merge", str(a), str(b), "--data", data, "--device", "cpu", "--mergekit-config",
           str(config)]
    assert main(cmd) == 0
    first = config.read_text()
    assert first.startswith("# written by rotviz ") and "merge_method: linear" in first
    assert main([*cmd, "--weight", "0.25", "--overwrite"]) == 0
    assert "weight: 0.75" in config.read_text() and "weight: 0.5" not in config.read_text()
    capsys.readouterr()
    assert main(cmd) == 2
    assert "already exists" in capsys.readouterr().err
    theirs = tmp_path / "theirs.yaml"
    theirs.write_text("merge_method: linear\n")
    assert main([*cmd[:-1], str(theirs), "--overwrite"]) == 2
    assert "was not written by rotviz" in capsys.readouterr().err
    assert theirs.read_text() == "merge_method: linear\n"


def test_every_default_is_mergekits():
    """Each parameter a method says to mergekit has mergekit 0.1.5's default as its own (its
    spec's; a required one, nearswap's t, has none), so a merge at rotviz's defaults is the
    merge mergekit makes at its own: DARE's and DELLA's --rescale is l1 (rescale: true)."""
    from mergekit.merge_methods.registry import get

    from rotviz.merging import methods

    compared = []
    for m in methods():
        e = m.mergekit
        if e is None:
            continue
        spec = {p.name: p for p in get(e.method).spec.parameters}
        for p in m.params:
            name = {**e.shared, **e.per_model}.get(p.name) or (p.name if p.name in e.values
                                                                else None)
            if name not in spec or spec[name].required:  # seed: --random-seed; no consensus
                continue
            ours = e.values[p.name][p.default] if p.name in e.values else p.default
            if ours is None:  # written as nothing: mergekit's own default
                continue
            assert ours == spec[name].default, (m.name, p.name, ours, spec[name].default)
            compared.append((m.name, name))
    assert {("della", "rescale"), ("della_linear", "rescale"), ("dare_linear", "rescale"),
            ("karcher", "max_iter"), ("ram", "epsilon")} <= set(compared)
