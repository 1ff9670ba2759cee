"""Benchmark the labelled-data paths: tokenizing labelled text, and the memory of a large
vocabulary's loss.

    python bench/tasks.py [--sentences 1000] [--measure 100] [--results bench/RESULTS.md]

1. A BERT-base-shape sequence classifier (768 wide, 12 layers, 12 heads, FFN 3072, its own
   WordPiece tokenizer trained here) on 1000 CSV sentences of 128 tokens: the seconds to read
   and tokenize them (rotviz's `split_for`, the model's own tokenizer) against a 21-point
   curve. A full curve is 21 forward passes over 128k tokens (about 7 minutes each on 2 CPU
   cores), so the passes are timed on `--measure` sentences and scaled linearly (a forward
   pass is linear in the number of sentences); the table says which numbers are measured.
   Target: tokenizing <= 10% of the curve.
2. Loss of a 32k-vocabulary language model on pystdlib windows: peak memory of the process
   (VmHWM, reset at its start) with rotviz's logit budget (rotviz.evaluation.LOGIT_ELEMENTS:
   batches shrink so that logits stay below 128 MB) against one batch of 512 windows.

Writes section `tasks` of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from bench.results import RESULTS, machine, write_section  # noqa: E402

MEMORY = r"""
import json, sys, torch
def hwm():  # peak resident memory (MB) since the last reset
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
open("/proc/self/clear_refs", "w").write("5")  # forget the peak inherited from the parent
from rotviz.evaluation import evaluate
from rotviz.data.reading import split_for
from rotviz.sources.loading import load_model
import rotviz.evaluation as E
torch.set_num_threads(1)
m = load_model(sys.argv[1])
sp = split_for(m, "pystdlib", "test")
if sys.argv[2] == "whole":
    E.LOGIT_ELEMENTS = 10**12  # no budget: every window's logits at once
before = hwm()
r = evaluate(m, sp, batch_size=512)
print(json.dumps({"loss": r["loss"], "windows": sp.n, "length": int(sp.inputs.shape[1]),
                  "before_mb": before, "peak_mb": hwm()}))
"""


def _tokenizer(vocab: int):
    from test_tokens import TEXT
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    t = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    t.train_from_iterator([TEXT], trainers.WordPieceTrainer(
        vocab_size=vocab, special_tokens=specials, show_progress=False))
    t.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", t.token_to_id("[CLS]")), ("[SEP]", t.token_to_id("[SEP]"))])
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="[UNK]", pad_token="[PAD]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


def classifier_rows(root: Path, sentences: int, measure: int) -> list[str]:
    import torch
    import transformers as T
    from test_tokens import TEXT

    from rotviz.data.reading import split_for
    from rotviz.measures.barrier import interpolate
    from rotviz.sources.loading import load_model

    tok = _tokenizer(8000)
    words = TEXT.split()
    rows = []
    for i in range(sentences):  # ~200 words each: every sentence fills its 128 tokens
        start = (i * 97) % (len(words) - 200)
        rows.append({"text": " ".join(words[start:start + 200]), "label": i % 2,
                     "split": "test"})
    for n, name in ((sentences, "all.csv"), (measure, "few.csv")):
        with open(root / name, "w", newline="") as f:
            w = csv.DictWriter(f, ["text", "label", "split"])
            w.writeheader()
            w.writerows(rows[:n])
    torch.manual_seed(0)
    cfg = T.BertConfig(vocab_size=30522, max_position_embeddings=512, num_labels=2)
    for seed in (0, 1):
        torch.manual_seed(seed)
        T.BertForSequenceClassification(cfg).eval().save_pretrained(root / f"bert{seed}")
        tok.save_pretrained(root / f"bert{seed}")
    a, b = load_model(str(root / "bert0")), load_model(str(root / "bert1"))
    t = time.perf_counter()
    split = split_for(a, f"csv:{root / 'all.csv'}", "test", seq_len=128)
    tokenize = time.perf_counter() - t
    assert split.n == sentences and split.inputs.shape[1] == 128
    few = split_for(a, f"csv:{root / 'few.csv'}", "test", seq_len=128)
    torch.set_num_threads(2)
    t = time.perf_counter()
    curve = interpolate(a, b, few, None, points=3)
    per_point = (time.perf_counter() - t) / 3  # the 0.5 point is among the three
    assert len(curve.loss) == 3
    full = per_point * sentences / measure * 21
    share = tokenize / (tokenize + full)
    return [
        f"| read + tokenize {sentences} sentences (128 tokens, csv:, model's tokenizer) | "
        f"{tokenize:.2f} s | measured |",
        f"| one curve point, {measure} sentences (BERT-base shape, 2 threads) | "
        f"{per_point:.1f} s | measured (3-point curve / 3) |",
        f"| 21-point curve, {sentences} sentences | {full / 60:.0f} min | scaled from the "
        "row above (linear in sentences) |",
        f"| tokenizing share of the curve | {100 * share:.3f}% | target <= 10%: "
        f"{'met' if share <= 0.10 else 'NOT met'} |",
    ]


def memory_rows(root: Path) -> list[str]:
    import torch
    import transformers as T
    from test_tokens import _bpe

    tok = _bpe()
    torch.manual_seed(0)
    cfg = T.GPT2Config(vocab_size=32000, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                       n_inner=128)
    T.GPT2LMHeadModel(cfg).eval().save_pretrained(root / "lm32k")
    tok.save_pretrained(root / "lm32k")
    out = {}
    for mode in ("budget", "whole"):
        proc = subprocess.run([sys.executable, "-c", MEMORY, str(root / "lm32k"), mode],
                              cwd=ROOT, capture_output=True, text=True, check=True)
        out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    b, w = out["budget"], out["whole"]
    assert abs(b["loss"] - w["loss"]) < 1e-5, (b, w)
    gb = 512 * w["length"] * 32000 * 4 / 2**30
    return [
        f"| 32k-vocabulary LM, {b['windows']} windows of {b['length']} tokens, rotviz's "
        f"logit budget | peak {b['peak_mb']:.0f} MB (before evaluating {b['before_mb']:.0f} "
        "MB) | measured |",
        f"| same, one batch of 512 windows (logits {gb:.1f} GB if materialised) | peak "
        f"{w['peak_mb']:.0f} MB | measured; the same loss to 1e-5 |",
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sentences", type=int, default=1000)
    p.add_argument("--measure", type=int, default=100)
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = classifier_rows(Path(tmp), args.sentences, args.measure)
        rows += memory_rows(Path(tmp))
    body = "\n".join([f"Machine: {machine()}", "", "| what | value | how |", "|---|---|---|",
                      *rows, "", "No GPU was lent to this task: no GPU rows."])
    print(body)
    write_section("tasks", body, args.results)


if __name__ == "__main__":
    main()
