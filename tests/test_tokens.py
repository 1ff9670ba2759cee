"""Text is read the way the model reads it: its own tokenizer, or rotviz's characters
only for a model that declares them.

Tiny causal and masked LMs are saved with a tokenizer trained here (`tokenizers`). rotviz's
loss must equal the model's own `model(input_ids, labels=...).loss` on ids that an
independent loop made with the folder's tokenizer.json; a BPE pair's barrier must equal a
reference loop; character ids must never reach a model with a tokenizer; output folders
carry the tokenizer.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from rotviz.arch import FAMILIES, Sizes, family_module, spec_named
from rotviz.cli import main
from rotviz.data.reading import split_for
from rotviz.data.split import load_split
from rotviz.data.splits import IGNORE
from rotviz.data.tasks import task_of_config
from rotviz.data.text import pystdlib_text
from rotviz.errors import RotvizError
from rotviz.evaluation import barrier_of, evaluate
from rotviz.sources.loading import load_model

SEQ = 16
TEXT = pystdlib_text()[:60_000]


def _bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator([TEXT], trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=t, eos_token="<|endoftext|>",
                                   bos_token="<|endoftext|>")


def _wordpiece(cls: str, sep: str):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", cls, sep, "[MASK]"]
    t = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    t.train_from_iterator([TEXT], trainers.WordPieceTrainer(
        vocab_size=300, special_tokens=specials, show_progress=False))
    t.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B {sep}",
        special_tokens=[(cls, t.token_to_id(cls)), (sep, t.token_to_id(sep))])
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="[UNK]", pad_token="[PAD]",
                                   cls_token=cls, sep_token=sep, mask_token="[MASK]")


def _decoder(kind: str) -> bool:
    """A family whose random model is a causal LM (an encoder gets a masked-LM head here)."""
    config = family_module(kind).random_config(Sizes())
    return task_of_config(spec_named(kind).inputs, config) == "text"


def _model(kind: str, vocab: int, seed: int):
    """The family's language model: its random config's causal LM, or an encoder's masked LM
    (`<Prefix>ForMaskedLM`), at this vocabulary and 64 positions, transformers' own init."""
    import transformers as T

    torch.manual_seed(seed)
    cfg = family_module(kind).random_config(Sizes(vocab=vocab), positions=64)
    if not _decoder(kind):
        prefix = re.split("For|LMHead", cfg["architectures"][0])[0]
        cfg |= {"architectures": [f"{prefix}ForMaskedLM"], "is_decoder": False}
    if spec_named(kind).positions_after is not None:  # position ids start after the pad id
        cfg |= {"max_position_embeddings": 66, "pad_token_id": 0}
    return getattr(T, cfg["architectures"][0])(T.AutoConfig.for_model(**cfg))


# every discovered text family (a new family file is covered without a line here)
KINDS = tuple(f for f in FAMILIES if spec_named(f).inputs == "tokens")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Per kind, two seeds saved with one tokenizer trained here, and the text file."""
    root = tmp_path_factory.mktemp("tok")
    text = root / "corpus.txt"
    text.write_text(TEXT, encoding="utf-8")
    out = {}
    for kind in KINDS:
        tok = _bpe() if _decoder(kind) else _wordpiece(
            "<s>" if kind == "roberta" else "[CLS]", "</s>" if kind == "roberta" else "[SEP]")
        pair = []
        for seed in (0, 1):
            d = root / f"{kind}-{seed}"
            model = _model(kind, len(tok), seed).eval()
            model.save_pretrained(d)
            tok.save_pretrained(d)
            pair.append(d)
        out[kind] = pair
    return out, text


def _own_windows(folder, masked: bool) -> torch.Tensor:
    """Windows made independently of rotviz: the folder's tokenizer, no special tokens, packed.
    The ids are its tokenizer.json's, read by the tokenizers library (AutoTokenizer in
    transformers 5 reads a qwen2 folder's file through Qwen2's own pre-tokenizer)."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    ids = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(
        TEXT, add_special_tokens=False).ids
    if not masked:
        n = (len(ids) - 1) // SEQ
        return torch.tensor(ids[: n * SEQ + 1])
    body = SEQ - 2
    n = len(ids) // body
    rows = [[tok.cls_token_id, *ids[i * body:(i + 1) * body], tok.sep_token_id] for i in range(n)]
    return torch.tensor(rows)


@pytest.mark.parametrize("kind", KINDS)
def test_loss_equals_the_models_own_loss_on_its_own_tokens(folders, kind):
    (a_dir, _), text = folders[0][kind], folders[1]
    loaded = load_model(a_dir)
    split = split_for(loaded, f"text:{text}", "test", seq_len=SEQ)
    masked = not _decoder(kind)
    assert split.task == ("masked" if masked else "text")
    assert split.encoding.startswith("tok:") and split.n_classes == 300
    own = _own_windows(a_dir, masked)
    if masked:  # every window is one of the tokenizer's own, with [CLS]/<s> ... [SEP]/</s>
        clean = split.inputs.clone()
        hidden = split.labels != IGNORE
        clean[hidden] = split.labels[hidden]
        rows = {tuple(r) for r in own.tolist()}
        assert all(tuple(r) in rows for r in clean.tolist())
        share = hidden.float().mean().item()
        assert 0.08 < share < 0.25 and bool(hidden.any(1).all())
        assert split.inputs[hidden].unique().tolist() == [4]  # the tokenizer's [MASK]
        ref_ids, ref_labels = split.inputs, split.labels
    else:  # each window and its targets are a stretch of the tokenizer's own ids
        starts = [int(np.flatnonzero((own[: len(own) - SEQ].unfold(0, SEQ, 1) == r).all(1))[0])
                  for r in split.inputs[:8]]
        for s, r, y in zip(starts, split.inputs[:8], split.labels[:8], strict=True):
            assert torch.equal(own[s:s + SEQ], r) and torch.equal(own[s + 1:s + SEQ + 1], y)
        ref_ids = torch.cat([split.inputs, split.labels[:, -1:]], 1)
        ref_labels = ref_ids
    with torch.no_grad():
        want = loaded.model(input_ids=ref_ids, labels=ref_labels).loss.item()
    got = evaluate(loaded, split)
    assert got["loss"] == pytest.approx(want, abs=1e-5)


def test_a_bpe_pairs_barrier_equals_a_reference_loop(folders):
    from rotviz.measures.barrier import interpolate

    (a_dir, b_dir), text = folders[0]["gpt2"], folders[1]
    a, b = load_model(a_dir), load_model(b_dir)
    split = split_for(a, f"text:{text}", "test", seq_len=SEQ)
    curve = interpolate(a, b, split, None, points=5)
    ids = torch.cat([split.inputs, split.labels[:, -1:]], 1)
    ref = []
    for alpha in curve.alphas:
        state = {k: torch.lerp(a.state[k], b.state[k], alpha)  # tied weights: owner only
                 for k, _ in a.model.named_parameters()}
        with torch.no_grad():
            ref.append(torch.func.functional_call(a.model, state, (ids,),
                                                  {"labels": ids}).loss.item())
    assert curve.loss == pytest.approx(ref, abs=1e-5)
    assert curve.barrier == pytest.approx(barrier_of(curve.alphas, ref), abs=1e-5)
    assert len(set(curve.loss)) == 5  # five different models on the path, each scored


def test_character_ids_never_reach_a_model_with_a_tokenizer(folders, capsys):
    (a_dir, _), text = folders[0]["gpt2"], folders[1]
    chars = load_split(f"text:{text}", "test")  # rotviz's characters
    with pytest.raises(RotvizError, match="read with rotviz's character vocabulary"):
        evaluate(load_model(a_dir), chars)
    # a model with neither a tokenizer nor the declaration: one line, exit 2
    bare = a_dir.parent / "bare"
    bare.mkdir()
    for f in ("config.json", "model.safetensors"):
        (bare / f).write_bytes((a_dir / f).read_bytes())
    rc = main(["eval", str(bare), "--data", f"text:{text}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert "has no tokenizer files" in err and "rotviz_vocab" in err
    # the zoo's character models declare theirs, and keep reading characters
    zoo = load_model("zoo:gpt2-pystdlib-s0")
    assert split_for(zoo, "pystdlib", "test").encoding == "chars"


def test_pairs_whose_tokenizers_differ_are_refused(folders, capsys):
    g = folders[0]["gpt2"][0]
    other = g.parent / "gpt2-other-tok"
    other.mkdir()
    for f in g.iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((other / "tokenizer_config.json").read_text())
    cfg["model_max_length"] = 77  # a different tokenizer file, same weights
    (other / "tokenizer_config.json").write_text(json.dumps(cfg))
    rc = main(["barrier", str(g), str(other), "--data", f"text:{folders[1]}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "read text differently" in err and len(err.splitlines()) == 1


def test_matched_output_carries_the_tokenizer_and_reloads_identically(folders, tmp_path):
    from transformers import AutoTokenizer

    (a_dir, b_dir), text = folders[0]["bert"], folders[1]
    out = tmp_path / "matched"
    assert main(["match", str(a_dir), str(b_dir), "--out", str(out)]) == 0
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (b_dir / name).read_bytes()
    t_src = AutoTokenizer.from_pretrained(str(b_dir), local_files_only=True)
    t_out = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    probe = "def heappush(heap, item):"
    assert t_out(probe)["input_ids"] == t_src(probe)["input_ids"]
    m, src = load_model(out), load_model(b_dir)
    split = split_for(m, f"text:{text}", "test", seq_len=SEQ)
    with torch.no_grad():
        diff = (m.model(input_ids=split.inputs).logits
                - src.model(input_ids=split.inputs).logits).abs().max().item()
    assert diff < 1e-4  # the matched model computes the source's function
    assert evaluate(m, split)["loss"] == pytest.approx(evaluate(src, split)["loss"], abs=1e-4)
