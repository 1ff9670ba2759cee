"""Hostile inputs to the checkpoint and config readers: every case is refused in one
line naming the file, by the in-memory and the streamed `rotviz match` alike, before anything
is built or written; and fuzzers over safetensors headers, index files and configs.

Each case copies a tiny saved model and damages the copy. Both paths then run in-process:
`rotviz match A B --out O` (in memory) and the same with `--max-memory 0` (streamed), and
each must exit 2 with one `rotviz: error:` line naming the offending file, write nothing
(no O, no `.rotviz-tmp-*`), leave the inputs as they were, and say what the other says.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import snapshot
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from rotviz.atsize.blocks import open_streamed
from rotviz.cli import main
from rotviz.errors import RotvizError
from rotviz.sources.checkpoint import INDEX, SINGLE, Checkpoint, parse_header
from rotviz.sources.loading import load_model
from rotviz.sources.shards import save_sharded

FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


# ---- building damaged copies --------------------------------------------------------------------


def _split(f: Path) -> tuple[dict, bytes]:
    """A safetensors file's header (parsed) and data bytes."""
    raw = f.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _write(f: Path, header: dict | str | bytes, data: bytes) -> None:
    """A safetensors file of `header` (a dict, or raw JSON text) and `data`."""
    text = header if isinstance(header, bytes) else (
        header if isinstance(header, str) else json.dumps(header)).encode()
    f.write_bytes(struct.pack("<Q", len(text)) + text + data)


def _tensor_of(header: dict, part: str) -> str:
    return next(k for k in header if part in k)


def header_case(change: Callable[[dict, bytes], tuple[dict | str, bytes]]
                ) -> Callable[[Path], str]:
    def damage(m: Path) -> str:
        f = m / SINGLE
        header, data = _split(f)
        _write(f, *change(header, data))
        return str(f)
    return damage


def _set_offsets(value):
    def change(h, data):
        h[_tensor_of(h, "ln_f.bias")]["data_offsets"] = value
        return h, data
    return change


def _set(field: str, value, part: str = "ln_f.bias"):
    def change(h, data):
        h[_tensor_of(h, part)][field] = value
        return h, data
    return change


def _nan_offsets(h, data):
    text = json.dumps(h)
    name = _tensor_of(h, "ln_f.bias")
    begin, end = h[name]["data_offsets"]
    old = json.dumps({name: h[name]})[1:-1]
    return text.replace(old, old.replace(f"[{begin}, {end}]", f"[NaN, {end}]")), data


def _overlap(h, data):
    """Two tensors sharing bytes (a header made of another tensor's data), the total kept."""
    a, b = _tensor_of(h, "ln_f.bias"), _tensor_of(h, "ln_f.weight")
    h[a]["data_offsets"] = list(h[b]["data_offsets"])
    return h, data


def _gap(h, data):
    return h, data + b"\0" * 8


def _deep(h, data):
    return "[" * 100_000 + "]" * 100_000, data


def _huge_header(h, data):
    return h, data  # replaced below: the length field lies


def config_case(change: Callable[[dict], object]) -> Callable[[Path], str]:
    def damage(m: Path) -> str:
        f = m / "config.json"
        cfg = json.loads(f.read_text())
        new = change(cfg)
        f.write_text(json.dumps(cfg if new is None else new))
        return str(f)
    return damage


def in_folder(damage: Callable[[Path], str]) -> Callable[[Path], str]:
    """A case whose message names the model folder (weights that do not fit its config)."""
    return lambda m: (damage(m), str(m))[1]


def _put(**values):
    return lambda cfg: cfg.update(values)


def _sharded(m: Path) -> dict:
    """`m`'s weights re-saved as three shards plus an index; returns the index."""
    state = load_file(str(m / SINGLE))
    (m / SINGLE).unlink()
    save_sharded(state, m, max_bytes=sum(t.numel() * 4 for t in state.values()) // 3)
    return json.loads((m / INDEX).read_text())


def index_case(change: Callable[[Path, dict], object], offending: str = INDEX
               ) -> Callable[[Path], str]:
    def damage(m: Path) -> str:
        index = _sharded(m)
        new = change(m, index)
        (m / INDEX).write_text(json.dumps(index if new is None else new))
        return str(m / offending) if offending else str(m)
    return damage


def _first(index: dict) -> tuple[str, str]:
    return next(iter(index["weight_map"].items()))


def _traverse(m: Path, index: dict) -> None:
    name, shard = _first(index)
    outside = m.parent / "elsewhere"
    outside.mkdir()
    for k, v in index["weight_map"].items():
        if v == shard:
            index["weight_map"][k] = "../elsewhere/" + shard
    shutil.move(str(m / shard), outside / shard)


def _absolute(m: Path, index: dict) -> None:
    name, shard = _first(index)
    for k, v in index["weight_map"].items():
        if v == shard:
            index["weight_map"][k] = str(m / shard)


def _link_out(m: Path, index: dict) -> None:
    name, shard = _first(index)
    outside = m.parent / "elsewhere"
    outside.mkdir()
    shutil.move(str(m / shard), outside / shard)
    (m / "sub").mkdir()
    (m / "sub" / shard).symlink_to(outside / shard)
    for k, v in index["weight_map"].items():
        if v == shard:
            index["weight_map"][k] = "sub/" + shard


def _fifo(m: Path, index: dict) -> None:
    name, shard = _first(index)
    (m / shard).unlink()
    os.mkfifo(m / shard)


def _twice(m: Path, index: dict) -> None:
    """One tensor saved in two shards (the index names one of them)."""
    shards = sorted(set(index["weight_map"].values()))
    a, b = shards[0], shards[1]
    ta, tb = load_file(str(m / a)), load_file(str(m / b))
    name = next(iter(ta))
    tb[name] = ta[name]
    save_file(tb, str(m / b), metadata={"format": "pt"})


def _unlisted(m: Path, index: dict) -> None:
    del index["weight_map"][_first(index)[0]]


def _misplaced(m: Path, index: dict) -> None:
    name, shard = _first(index)
    index["weight_map"][name] = next(v for v in index["weight_map"].values() if v != shard)


def _both(m: Path, index: dict) -> None:
    shutil.copyfile(m / sorted(set(index["weight_map"].values()))[0], m / SINGLE)


def fifo_at(name: str) -> Callable[[Path], str]:
    """The file `name` replaced by a FIFO: a reader that opened it would block forever."""
    def damage(m: Path) -> str:
        (m / name).unlink()
        os.mkfifo(m / name)
        return str(m / name)
    return damage


def nan_late_block(m: Path) -> str:
    state = load_file(str(m / SINGLE))
    key = next(k for k in state if ".h.1.mlp.c_fc.weight" in k)
    state[key] = state[key].clone()
    state[key][3, 5] = float("nan")
    save_file(state, str(m / SINGLE), metadata={"format": "pt"})
    return key


# (case id, family, damage(folder) -> the text the message must name, words it must hold)
CASES: list[tuple[str, str, Callable[[Path], str], str]] = [
    # safetensors headers
    ("offsets-str", "gpt2", header_case(_set_offsets(["abc", 4])), "data_offsets"),
    ("offsets-null", "gpt2", header_case(_set_offsets(None)), "data_offsets"),
    ("offsets-nan", "gpt2", header_case(_nan_offsets), "cannot parse"),
    ("offsets-float", "gpt2", header_case(_set_offsets([0.5, 128.5])), "data_offsets"),
    ("offsets-negative", "gpt2", header_case(_set_offsets([-128, 0])), "data_offsets"),
    ("offsets-bool", "gpt2", header_case(_set_offsets([False, True])), "data_offsets"),
    ("offsets-overlap", "gpt2", header_case(_overlap), "transformer.ln_f"),
    ("offsets-gap", "gpt2", header_case(_gap), "bytes after the header"),
    ("dtype-list", "gpt2", header_case(_set("dtype", ["F32"])), "dtype"),
    ("dtype-unknown", "gpt2", header_case(_set("dtype", "F8_E4M3")), "dtype"),
    ("shape-str", "gpt2", header_case(_set("shape", ["32"])), "shape"),
    ("shape-negative", "gpt2", header_case(_set("shape", [-32])), "shape"),
    ("shape-bool", "gpt2", header_case(_set("shape", [True])), "shape"),
    ("shape-size", "gpt2", header_case(_set("shape", [16])), "does not fit its bytes"),
    ("metadata-list", "gpt2",
     header_case(lambda h, d: ({**h, "__metadata__": ["pt"]}, d)), "__metadata__"),
    ("header-deep", "gpt2", header_case(_deep), "nested deeper"),
    ("header-list", "gpt2", header_case(lambda h, d: ("[1, 2]", d)), "table of tensors"),
    ("single-fifo", "gpt2", fifo_at(SINGLE), "not a regular file"),
    ("config-fifo", "gpt2", fifo_at("config.json"), "not a regular file"),
    # index files
    ("index-list", "gpt2", index_case(lambda m, i: [1, 2]), "not a JSON object"),
    ("weight-map-list", "gpt2", index_case(lambda m, i: {"weight_map": [1]}), "list"),
    ("weight-map-empty", "gpt2", index_case(lambda m, i: {"weight_map": {}}), "empty"),
    ("weight-map-number", "gpt2",
     index_case(lambda m, i: i["weight_map"].update({_first(i)[0]: 7})), "not a file name"),
    ("index-traverses", "gpt2", index_case(_traverse, ""), "../elsewhere"),
    ("index-absolute", "gpt2", index_case(_absolute, ""), "not a plain relative name"),
    ("index-links-out", "gpt2", index_case(_link_out, ""), "outside the folder"),
    ("shard-fifo", "gpt2", index_case(_fifo, ""), "not a regular file"),
    ("tensor-twice", "gpt2", index_case(_twice, ""), "two shards"),
    ("tensor-unlisted", "gpt2", index_case(_unlisted, ""), "does not list"),
    ("tensor-misplaced", "gpt2", index_case(_misplaced, ""), "do not match their index"),
    ("index-and-single", "gpt2", index_case(_both, ""), "holds both"),
    # configs
    ("config-list", "gpt2", config_case(lambda c: [c]), "JSON list"),
    ("config-n-layer-huge", "gpt2", config_case(_put(n_layer=1_000_000_000)), "n_layer"),
    ("config-n-layer-more", "gpt2", config_case(_put(n_layer=3)), "n_layer is 3"),
    ("config-width-str", "gpt2", config_case(_put(n_embd="32")), "n_embd '32'"),
    ("config-width-bool", "gpt2", config_case(_put(n_layer=True)), "n_layer True"),
    ("config-width-other", "gpt2", config_case(_put(n_embd=64)), "n_embd is 64"),
    ("config-heads", "gpt2", config_case(_put(n_head=5)), "does not divide"),
    ("config-ffn-other", "gpt2", config_case(_put(n_inner=1 << 20)), "feed-forward"),
    ("config-vocab-huge", "gpt2", config_case(_put(vocab_size=2**40)), "vocab_size"),
    ("config-vocab-other", "gpt2", config_case(_put(vocab_size=4_000_000)), "vocab_size"),
    ("config-positions", "gpt2", config_case(_put(n_positions=4096)), "positions"),
    ("config-id2label-empty", "gpt2", config_case(_put(id2label={})), "id2label"),
    ("config-architectures-other-kind", "gpt2",
     config_case(_put(architectures=["BertModel"])), "another kind"),
    ("config-architectures-lie", "gpt2",
     in_folder(config_case(_put(architectures=["GPT2ForSequenceClassification"]))),
     "do not fit its config (missing ['score.weight'])"),
    ("config-patch-zero", "vit", config_case(_put(patch_size=0)), "patch_size"),
    ("config-image-huge", "vit", config_case(_put(image_size=2**31)), "image_size"),
    ("config-image-other", "vit", in_folder(config_case(_put(image_size=16))),
     "differs from what config.json describes: ['vit.embeddings.position_embeddings']"),
    ("config-channels", "vit", config_case(_put(num_channels=3)), "channels"),
]


def _tmp_left(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith(".rotviz-tmp")]


def _run(argv: list[str], capsys) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, err


@pytest.fixture
def no_hang():
    """A FIFO that blocked a reader would hang the run: fail it after 60 s instead."""
    def alarm(*_):
        raise TimeoutError("a read blocked")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_refused_alike_by_both_paths(case, saved, tmp_path, capsys, no_hang):
    _, family, damage, words = case
    anchor = saved(family, 0)
    bad = tmp_path / "in" / "bad"
    shutil.copytree(saved(family, 1), bad)
    named = damage(bad)
    before = snapshot(tmp_path / "in", anchor)
    out = tmp_path / "out" / "O"
    out.parent.mkdir()
    lines = []
    for extra in ([], ["--max-memory", "0"]):
        rc, err = _run(["match", str(anchor), str(bad), "--out", str(out), *extra], capsys)
        got = err.strip().splitlines()
        assert rc == 2, err
        assert len(got) == 1 and got[0].startswith("rotviz: error: "), err
        assert named in got[0] and words in got[0], got[0]
        assert not out.exists() and not _tmp_left(tmp_path)
        assert snapshot(tmp_path / "in", anchor) == before
        lines.append(got[0])
    assert lines[0] == lines[1]
    if family == "gpt2":  # `rotviz eval` loads it the same way
        rc, err = _run(["eval", str(bad), "--data", "pystdlib", "--json",
                        str(tmp_path / "out" / "e.json")], capsys)
        assert rc == 2 and err.strip() == lines[0], err
        assert not (tmp_path / "out" / "e.json").exists()
        assert snapshot(tmp_path / "in", anchor) == before


def test_header_length_beyond_the_file(saved, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(saved("gpt2", 1), bad)
    f = bad / SINGLE
    raw = bytearray(f.read_bytes())
    raw[:8] = struct.pack("<Q", 2**62)
    f.write_bytes(bytes(raw))
    for extra in ([], ["--max-memory", "0"]):
        rc, err = _run(["match", str(saved("gpt2", 0)), str(bad), "--out",
                        str(tmp_path / "O"), *extra], capsys)
        assert rc == 2 and err.count("\n") == 1
        assert f"'{f}'" in err and f"header of {2**62} bytes" in err
    assert not (tmp_path / "O").exists()


def test_the_finiteness_check_misses_nothing_and_accuses_nothing():
    """Slices are checked by their least and largest entries, which a NaN or an Inf anywhere
    makes NaN or infinite; entries at the dtype's edge (whose sum would overflow) pass, in
    every floating dtype, in a slice past the first too."""
    from rotviz.sources.checkpoint import check_finite_tensor

    big = torch.full((3, 5), 1e308, dtype=torch.float64)  # a sum would overflow to inf
    check_finite_tensor(big, "w", "here")
    check_finite_tensor(torch.tensor([-3e38, 3e38, 3e38], dtype=torch.bfloat16), "w", "here")
    check_finite_tensor(torch.tensor([-65504.0, 65504.0], dtype=torch.float16), "w", "here")
    check_finite_tensor(torch.empty(0, 4), "w", "here")
    long = torch.zeros((1 << 22) + 7, dtype=torch.float32)  # two slices
    for bad in (float("nan"), float("inf"), float("-inf")):
        for t in (big.clone(), torch.ones(4, 3, dtype=torch.bfloat16),
                  torch.ones(4, 3, dtype=torch.float16), long.clone().view(-1, 1)):
            t[2 if len(t) < 8 else -3, 0] = bad  # the long one: in its second slice
            with pytest.raises(RotvizError, match="'here' has NaN or Inf weights in w;"):
                check_finite_tensor(t, "w", "here")


def test_nan_in_a_late_block_is_one_line_in_both_paths(saved, tmp_path, capsys):
    """The streamed path checks each block as it reads it, with the in-memory message
    (before: a scipy ValueError traceback from the solver)."""
    bad = tmp_path / "bad"
    shutil.copytree(saved("gpt2", 1), bad)
    key = nan_late_block(bad)
    want = (f"rotviz: error: '{bad}' has NaN or Inf weights in {key}; the checkpoint is "
            "corrupt or diverged")
    for extra in ([], ["--max-memory", "0"]):
        rc, err = _run(["match", str(saved("gpt2", 0)), str(bad), "--out",
                        str(tmp_path / "O"), *extra], capsys)
        assert rc == 2 and err.strip() == want, err
        assert not (tmp_path / "O").exists() and not _tmp_left(tmp_path)


def test_a_pickled_checkpoint_that_is_a_fifo_does_not_block(saved, tmp_path, capsys, no_hang):
    m = tmp_path / "bin"
    shutil.copytree(saved("gpt2", 1), m)
    (m / SINGLE).unlink()
    os.mkfifo(m / "pytorch_model.bin")
    rc, err = _run(["match", str(saved("gpt2", 0)), str(m), "--out", str(tmp_path / "O")],
                   capsys)
    assert rc == 2 and err == (f"rotviz: error: weights file '{m / 'pytorch_model.bin'}' is "
                               "not a regular file; give a regular file\n")
    assert not (tmp_path / "O").exists()


def test_the_app_reads_no_weights_outside_its_roots(saved, tmp_path):
    """Under a Confined of the app's roots, a model whose weights file or shard links out of
    the roots is refused by both loaders, naming the file."""
    from rotviz.confine import Confined

    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    elsewhere.mkdir()
    m = root / "m"
    shutil.copytree(saved("gpt2", 1), m)
    shutil.move(str(m / SINGLE), elsewhere / SINGLE)
    (m / SINGLE).symlink_to(elsewhere / SINGLE)
    app = Confined.under([root])
    for load in (load_model, open_streamed):
        with pytest.raises(RotvizError) as e:
            load(m, confined=app)
        assert str(e.value).startswith(f"weights file '{m / SINGLE}' leads to "
                                       f"'{elsewhere / SINGLE}', outside the roots")
    assert load_model(m).state  # the command line reads where its user points
    sharded = root / "s"
    shutil.copytree(saved("gpt2", 1), sharded)
    index = _sharded(sharded)
    shard = sorted(set(index["weight_map"].values()))[1]
    shutil.move(str(sharded / shard), elsewhere / shard)
    (sharded / shard).symlink_to(elsewhere / shard)
    for load in (load_model, open_streamed):
        with pytest.raises(RotvizError, match="outside the roots"):
            load(sharded, confined=app)


def test_a_sharded_checkpoint_in_a_subfolder_still_loads(saved, tmp_path):
    """Index entries may name shards in a subfolder (transformers joins them to the folder):
    accepted, and read to the same tensors, by both paths."""
    m = tmp_path / "m"
    shutil.copytree(saved("gpt2", 1), m)
    index = _sharded(m)
    (m / "sub").mkdir()
    for shard in set(index["weight_map"].values()):
        shutil.move(str(m / shard), m / "sub" / shard)
    index["weight_map"] = {k: "sub/" + v for k, v in index["weight_map"].items()}
    (m / INDEX).write_text(json.dumps(index))
    want = load_file(str(saved("gpt2", 1) / SINGLE))
    got = Checkpoint(m).read(list(want), None)
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert set(open_streamed(m).checkpoint.keys()) == set(want)
    loaded = load_model(m)
    assert torch.equal(loaded.state["transformer.h.1.mlp.c_fc.weight"],
                       want["transformer.h.1.mlp.c_fc.weight"])


# ---- fuzzers ------------------------------------------------------------------------------------

_TENSORS = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3),
            "b": torch.arange(4, dtype=torch.int64), "c": torch.ones(0, 5, dtype=torch.float16)}
_ODD = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                 st.floats(allow_nan=False), st.text(max_size=4),
                 st.lists(st.integers(-3, 40), max_size=3))


_READ = {torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
         torch.int16, torch.int8, torch.uint8, torch.bool}  # the dtypes rotviz reads


def _valid_header() -> tuple[dict, bytes]:
    header, data, at = {"__metadata__": {"format": "pt"}}, b"", 0
    names = {torch.float32: "F32", torch.int64: "I64", torch.float16: "F16"}
    for k, t in _TENSORS.items():
        raw = t.numpy().tobytes()
        header[k] = {"dtype": names[t.dtype], "shape": list(t.shape),
                     "data_offsets": [at, at + len(raw)]}
        data += raw
        at += len(raw)
    return header, data


@st.composite
def headers(draw) -> tuple[bytes, bytes]:
    """A valid header with a few fields replaced (by odd values or by near misses)."""
    header, data = _valid_header()
    for _ in range(draw(st.sampled_from([0, 1, 1, 2, 3]))):
        name = draw(st.sampled_from([*_TENSORS, "__metadata__"]))
        if name == "__metadata__":
            header[name] = draw(st.one_of(_ODD, st.dictionaries(st.text(max_size=3), _ODD,
                                                                max_size=2)))
            continue
        field = draw(st.sampled_from(["dtype", "shape", "data_offsets", "drop"]))
        if not isinstance(header.get(name), dict):
            continue
        if field == "drop":
            header.pop(name, None)
        elif field == "data_offsets" and draw(st.booleans()):
            old = header[name].get("data_offsets")
            b, e = old if isinstance(old, list) and len(old) == 2 and all(
                isinstance(o, int) for o in old) else (0, 0)
            header[name]["data_offsets"] = [b + draw(st.integers(-8, 8)),
                                            e + draw(st.integers(-8, 8))]
        else:
            header[name][field] = draw(st.one_of(_ODD, st.sampled_from(
                ["F32", "I64", "F16", "BF16", "F8", "U8", "F8_E4M3", "U16"])))
    tail = draw(st.sampled_from([b"", b"", b"", b"\0" * 4]))
    return json.dumps(header).encode(), data + tail


@FUZZ
@given(headers())
def test_fuzz_headers_match_the_safetensors_library(tmp_path_factory, case):
    """rotviz's header reader accepts exactly what safetensors accepts (in the dtypes rotviz
    reads) and reads the same tensors; anything else is a RotvizError, never another
    exception."""
    head, data = case
    folder = tmp_path_factory.mktemp("fuzz")
    f = folder / SINGLE
    _write(f, head, data)
    try:
        want = load_file(str(f))
    except Exception:  # safetensors refuses it: so must rotviz
        want = None
    if want is not None and any(t.dtype not in _READ for t in want.values()):
        want = None  # a dtype safetensors knows and rotviz does not read: refused
    try:
        checkpoint = Checkpoint(folder)
        got = checkpoint.read(checkpoint.keys(), None)
    except RotvizError:
        got = None
    event("refused" if got is None else "accepted")
    assert (got is None) == (want is None), (head, want)
    if got is not None:
        assert set(got) == set(want)
        for k in want:
            assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k])
    try:
        parse_header(head, len(data), f)
    except RotvizError:
        assert got is None


@FUZZ
@given(st.data())
def test_fuzz_index_files(saved, tmp_path_factory, data):
    """An index with entries changed, added or dropped: Checkpoint and the in-memory reader
    (read_weights, which validates it the same way) agree, and an index they accept reads
    every tensor from the right shard."""
    from rotviz.sources.files import read_weights

    src = saved("gpt2", 1)
    m = tmp_path_factory.mktemp("idx") / "m"
    shutil.copytree(src, m)
    index = _sharded(m)
    wm = json.loads(json.dumps(index["weight_map"]))
    names, shards = list(wm), sorted(set(wm.values()))
    for _ in range(data.draw(st.sampled_from([0, 1, 1, 2]))):
        op = data.draw(st.sampled_from(["move", "move", "drop", "add", "value", "map"]))
        if op == "move" and isinstance(wm, dict) and wm:
            wm[data.draw(st.sampled_from(names))] = data.draw(st.sampled_from(
                [*shards, "../" + shards[0], "/" + shards[0], "nope.safetensors", ""]))
        elif op == "drop" and isinstance(wm, dict):
            wm.pop(data.draw(st.sampled_from(names)), None)
        elif op == "add" and isinstance(wm, dict):
            wm[data.draw(st.text(max_size=5))] = data.draw(st.sampled_from(shards))
        elif op == "value" and isinstance(wm, dict) and wm:
            wm[data.draw(st.sampled_from(names))] = data.draw(_ODD)
        elif op == "map":
            wm = data.draw(_ODD)
    (m / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    want = load_file(str(src / SINGLE))
    verdicts = []
    for read in (lambda: Checkpoint(m).read(Checkpoint(m).keys(), None),
                 lambda: read_weights(m)):
        try:
            got = read()
        except RotvizError as e:
            verdicts.append(str(e))
            continue
        # accepted: the index lists exactly the tensors its shards hold, where they are (an
        # index that leaves a whole shard out describes a smaller checkpoint, which the
        # model's own check then refuses)
        assert isinstance(wm, dict) and set(got) == set(wm)
        assert all(wm[k] == index["weight_map"][k] and torch.equal(got[k], want[k])
                   for k in got)
        verdicts.append(None)
    event("refused" if verdicts[0] else "accepted")
    assert verdicts[0] == verdicts[1]
    if wm == index["weight_map"]:
        assert verdicts[0] is None


_SIZES = ["n_layer", "n_embd", "n_head", "vocab_size", "n_positions", "n_inner"]


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.data())
def test_fuzz_configs(saved, tmp_path_factory, data):
    """A config with size fields replaced: load_model and open_streamed give the same
    verdict (both load, or both refuse with the same RotvizError), and nothing else is
    raised; a huge value never reaches an allocation (each example is quick)."""
    src = saved("gpt2", 1)
    m = tmp_path_factory.mktemp("cfg") / "m"
    shutil.copytree(src, m)
    cfg = json.loads((m / "config.json").read_text())
    for _ in range(data.draw(st.sampled_from([0, 1, 1, 2, 3]))):
        key = data.draw(st.sampled_from([*_SIZES, "id2label", "architectures"]))
        how = data.draw(st.sampled_from(["same", "odd", "pick", "pick"]))
        if how == "odd":
            cfg[key] = data.draw(_ODD)
        elif how == "pick":
            cfg[key] = data.draw(st.sampled_from(
                [2, 32, 61, 64, 2**31, 10**9, [], {}, {"0": "a"}, ["GPT2Model"],
                 ["GPT2LMHeadModel"], None]))
    (m / "config.json").write_text(json.dumps(cfg))
    verdicts = []
    for load in (load_model, open_streamed):
        try:
            load(m)
            verdicts.append(None)
        except RotvizError as e:
            verdicts.append(str(e))
    event("refused" if verdicts[0] else "accepted")
    assert verdicts[0] == verdicts[1]


def test_a_fit_check_passed_is_not_made_again_and_a_changed_folder_is(saved, tmp_path,
                                                                       monkeypatch):
    """The fit check (the module built on meta, compared with the checkpoint's names and
    shapes) is kept once passed, by the family, the config and the headers: loading the same
    folder again builds no meta module, and the same folder with a config its weights no
    longer fit is refused as before."""
    import rotviz.atsize.runtime as runtime

    path = tmp_path / "m"
    shutil.copytree(saved("gpt2", 0), path)
    load_model(path)
    built = []
    real = runtime.checked_meta
    monkeypatch.setattr(runtime, "checked_meta", lambda *a: built.append(a) or real(*a))
    load_model(path)
    assert built == []
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(
        {**cfg, "architectures": ["GPT2ForSequenceClassification"]}))
    with pytest.raises(RotvizError, match=r"do not fit its config \(missing \['score.weight'\]\)"):
        load_model(path)
    assert len(built) == 1
