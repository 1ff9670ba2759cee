"""Whether two loaded models can be compared, matched or merged: the same reading of their
inputs (tokenizer, image processor), the same labels, and the same body; heads that differ
are found and named (`HeadsDiffer`), so a pair with different heads is refused or handled
on purpose, never averaged by accident.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rotviz.arch import ArchSpec, config_value
from rotviz.data.tokens import (
    encoding_fingerprint,
    processor_fingerprint,
)
from rotviz.errors import RotvizError
from rotviz.sources.loading import Loaded

Tensor = torch.Tensor



def check_same_reading(a: Loaded, b: Loaded, labels: bool = True) -> None:
    """Two models are compared on one set of inputs: they must read them alike. Text: the
    same tokenizer files, or both rotviz's characters (a model that reads none is let through
    here; the first evaluation says why it cannot be fed). Images: the same image processor,
    or neither has one. Classifiers that name the same labels (unless `labels` is False: two
    heads whose outputs are never paired): in the same order, as output i of one is compared
    with output i of the other."""
    if labels:
        check_same_labels(a, b)
    if a.spec.inputs == "pixels":
        pa, pb = processor_fingerprint(a.path), processor_fingerprint(b.path)
        if pa != pb:
            raise RotvizError(
                f"'{a.ref}' and '{b.ref}' read images differently ({pa or 'no processor'} vs "
                f"{pb or 'no processor'}): one set of pixels cannot feed both; save the same "
                "image processor with both")
        return
    try:
        fa = encoding_fingerprint(a.path, a.config, a.ref)
        fb = encoding_fingerprint(b.path, b.config, b.ref)
    except RotvizError:
        return
    if fa != fb:
        raise RotvizError(
            f"'{a.ref}' and '{b.ref}' read text differently ({fa} vs {fb}): one set of ids "
            "cannot feed both; compare two models that share a tokenizer"
        )


def check_same_labels(a: Loaded, b: Loaded) -> None:
    """One line when both models name the same labels (config id2label) in another order:
    matching, interpolating or merging would pair output i of one with another label's
    output of the other, and data labelled for one would score the other against labels it
    never meant. Models with different label sets (say, fine-tunes for two tasks whose
    bodies are compared) and models with unnamed labels (LABEL_i) are taken at their ids,
    as before."""
    from rotviz.data.tasks import named_labels

    try:
        na, nb = named_labels(a.config, a.ref), named_labels(b.config, b.ref)
    except RotvizError:
        return  # an odd id2label is refused where labels are read by name
    if na is not None and nb is not None and na != nb and sorted(na) == sorted(nb):
        def some(names: tuple[str, ...]) -> str:
            return ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")

        raise RotvizError(
            f"'{a.ref}' and '{b.ref}' order their labels differently ({some(na)} vs "
            f"{some(nb)}): output i of one is not output i of the other; compare models "
            "whose config.json id2label are the same")


@dataclass(frozen=True)
class HeadsDiffer:
    """Two models of one body under different heads (a pre-training checkpoint and a
    fine-tuned classifier, two classifiers with different labels): the tensors both hold
    alike (the body, and any head part they share), each one's own head tensors (in one
    model only, or shaped differently), and both head classes. Matching aligns the shared
    tensors; the source's own head moves with its body (its function is kept) but is matched
    against nothing; the anchor's own head is left alone."""

    anchor_head: str
    source_head: str
    shared: tuple[str, ...]
    anchor_only: tuple[str, ...]
    source_only: tuple[str, ...]

    blocks: tuple[str, ...] = ()  # the shared tensors that are a block's
    # the anchor's names of `shared` (which holds the source's), in the same order: a
    # headless model's body is not under the root a headed one's is
    anchor_names: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"anchor_head": self.anchor_head, "source_head": self.source_head,
                "matched": len(self.shared), "matched_outside_blocks": self.outside(),
                "source_only": list(self.source_only), "anchor_only": list(self.anchor_only),
                "summary": self.words()}

    def outside(self) -> list[str]:
        """The shared tensors that are no block's (embeddings, norms, shared head parts)."""
        inside = set(self.blocks)
        return [k for k in self.shared if k not in inside]

    def words(self) -> str:
        """The pair's heads and what matching did with them, in one sentence."""
        def some(names: tuple[str, ...]) -> str:
            return (", ".join(names[:3]) + (", ..." if len(names) > 3 else "")) or "none"

        return (f"heads differ ({self.anchor_head or 'no head'} vs "
                f"{self.source_head or 'no head'}): matched the {len(self.shared)} tensors "
                f"both hold; the source's own {len(self.source_only)} ({some(self.source_only)})"
                f" moved with its body, unmatched; the anchor's own {len(self.anchor_only)} "
                f"({some(self.anchor_only)}) left alone")


def body_patterns(spec: ArchSpec):
    """Regular expressions of a family's block tensors and of its whole body (the blocks,
    the stream's writers, the norms on the stream and the final norm), under its roots."""
    import re

    roots = "|".join(re.escape(r) for r in spec.roots)
    blocks = [re.escape(t).replace(r"\{i\}", r"\d+") for t in spec.block]
    rest = [re.escape(n) + r"(\.|$)" for n in (*spec.writers, *spec.stream_norms,
                                                 *spec.final_norm)]
    return (re.compile(f"^(?:{roots})(?:{'|'.join(blocks)})"),
            re.compile(f"^(?:{roots})(?:{'|'.join(blocks + rest)})"))


def _root(loaded: Loaded) -> str:
    """The prefix `loaded`'s blocks sit under (one of its family's roots: "bert." inside a
    BertForPreTraining, "" in a headless BertModel): the first whose block 0 is present, as
    rotviz.symmetry.view.resolve_layout picks it."""
    firsts = [(r, r + t.format(i=0)) for r in loaded.spec.roots for t in loaded.spec.block]
    return next((r for r, first in firsts if any(k.startswith(first) for k in loaded.state)),
                "")


def heads_differ(a: Loaded, b: Loaded) -> HeadsDiffer | None:
    """How `a` and `b` differ where they hold the same body under different heads; None when
    they hold the same tensors (the same head), or when their bodies differ (then
    check_compatible says how). A headless model's body sits at the top (BertModel's
    `encoder...`), a headed one's under its root (`bert.encoder...`): tensors are paired by
    their names under the root."""
    from rotviz.heads import head_of_config

    if a.spec.family != b.spec.family:
        return None
    blocks, body = body_patterns(a.spec)
    ra, rb = _root(a), _root(b)

    def under(k: str, root: str) -> str:
        return k[len(root):] if k.startswith(root) else k

    names_a = {under(k, ra): k for k in a.state}
    names_b = {under(k, rb): k for k in b.state}
    pairs = [(names_a[r], k) for r, k in names_b.items()
             if r in names_a and a.state[names_a[r]].shape == b.state[k].shape]
    if ra == rb and len(pairs) == len(a.state) == len(b.state):
        return None
    paired_a, paired_b = {x for x, _ in pairs}, {y for _, y in pairs}
    own_a = tuple(k for k in a.state if k not in paired_a)
    own_b = tuple(k for k in b.state if k not in paired_b)
    if any(body.match(k) for k in (*own_a, *own_b)) or not any(body.match(y) for _, y in pairs):
        return None
    shared = tuple(y for _, y in pairs)
    return HeadsDiffer(head_of_config(a.config).class_name, head_of_config(b.config).class_name,
                       shared, own_a, own_b, tuple(k for k in shared if blocks.match(k)),
                       tuple(x for x, _ in pairs))


def check_compatible(a: Loaded, b: Loaded, heads: bool = False) -> None:
    """Two models must share family, config shape fields and tensor shapes to be matched.
    With `heads`, a pair of one body under different heads (`heads_differ`) is let through
    too (matching aligns the body; a measurement of the loss needs one head on both)."""
    if a.spec.family != b.spec.family:
        raise RotvizError(
            f"different architectures: '{a.ref}' is {a.spec.family}, '{b.ref}' is {b.spec.family}"
        )
    fields = []
    for keys in (
        a.spec.n_layers_key,
        a.spec.d_model_key,
        a.spec.n_heads_key,
        a.spec.activation_key,
    ):
        va, vb = config_value(a.config, keys), config_value(b.config, keys)
        if va != vb:
            fields.append(f"{keys[0]} {va} vs {vb}")
    shapes = [
        f"{k} {tuple(a.state[k].shape)} vs {tuple(b.state[k].shape)}"
        for k in a.state
        if k in b.state and a.state[k].shape != b.state[k].shape
    ]
    only = sorted(set(a.state) ^ set(b.state))
    if not fields and (shapes or only) and heads_differ(a, b) is not None:
        if heads:
            check_same_reading(a, b, labels=False)
            return
        from rotviz.heads import head_of_config

        ha, hb = (head_of_config(m.config).class_name or "no head" for m in (a, b))
        raise RotvizError(
            f"'{a.ref}' ({ha}) and '{b.ref}' ({hb}) share a body under different heads, which "
            "only matching in memory and the views of the weights (distances, spectra) "
            "compare: a loss runs one head on both, a streamed run pairs tensors by name")
    if not (fields or shapes or only):
        check_same_reading(a, b)
    if fields or shapes or only:
        parts = fields or shapes[:3] or [f"tensors only in one model: {only[:3]}"]
        raise RotvizError(
            f"models differ in shape: {'; '.join(parts)}; match two models of one architecture"
        )


# ---- running ------------------------------------------------------------------------------
