"""Instability against the spawn step (rotviz.measures.spawn): the zoo's spawn series as its
registry entry says (children spawned at the last step are the parent, twice), and a child
spawned and trained in the parent's own data order is the parent, bit for bit. Both charts on
the zoo's series, each step's barrier `rotviz barrier`'s, and the spawn folder's refusals:
tests/measures/test_training.py."""

from __future__ import annotations

import pytest
import torch


def test_zoo_spawn_series_layout_and_its_identities():
    """The shipped series as its registry entry says: children spawned at the last step are
    the parent's last checkpoint, twice (bit for bit); the runs spawned at 0 share their
    start and end as spawn-0's children; the card records recipe, seeds and steps."""
    from rotviz import zoo_registry as zoo
    from rotviz.sources.loading import load_model

    ent = zoo.spawn_entry("vit-digits-spawn")
    root = zoo.collection_path(ent.name)
    card = zoo.read_card(root)
    assert card["recipe"]["name"] == ent.recipe and card["seed"] == ent.seed
    assert card["spawn_steps"] == list(ent.spawn_steps) == [0, 16, 64, 304]
    assert card["orders"] == [1, 2] and card["steps"] == 304
    assert card["recipe"]["model"] == zoo.read_card("vit-digits-s3")["recipe"]["model"]
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    assert size < 12e6, size

    def state(rel):
        return load_model(root / rel).state

    def same(x, y):
        return all(torch.equal(x[k], y[k]) for k in x)

    last = ent.spawn_steps[-1]
    assert same(state(f"spawn-{last}/a"), state(f"spawn-{last}/b"))
    assert not same(state("spawn-16/a"), state("spawn-16/b"))
    assert same(state("run-a/checkpoint-0"), state("run-b/checkpoint-0"))
    assert same(state(f"run-a/checkpoint-{last}"), state("spawn-0/a"))
    assert same(state(f"run-b/checkpoint-{last}"), state("spawn-0/b"))
    assert card["test"][f"spawn-{last}/a"]["acc"] > 0.85  # a trained model, not noise
    from rotviz.data.split import load_split
    from rotviz.evaluation import evaluate

    # the card says what ships
    got = evaluate(load_model(root / "spawn-16/b"), load_split("digits", "test", 0))
    assert got["loss"] == pytest.approx(card["test"]["spawn-16/b"]["loss"], rel=1e-6)
    assert got["acc"] == card["test"]["spawn-16/b"]["acc"]


def test_spawned_child_in_the_parents_order_is_the_parent():
    """rotviz.zoo.train.run_steps: a child spawned at k and trained in the parent's own data
    order reproduces the parent's last weights bit for bit (weights, Adam's moments and the
    schedule all carried over); another order does not."""
    from rotviz.data.split import load_split
    from rotviz.zoo import recipes, train

    rec = recipes.Recipe("tiny-spawn", "vit", "digits", dict(recipes._VIT_DIGITS,
                         hidden_size=16, num_hidden_layers=1, intermediate_size=32),
                         epochs=2, batch_size=200, warmup_epochs=0.5)
    data = load_split("digits", "train", 0).subset(400)
    parent = train.run_steps(rec, 0, data, 5, {1, 4})
    assert sorted(parent) == [1, 4]
    same = train.run_steps(rec, 0, data, 5, {4}, parent[1])[4]
    other = train.run_steps(rec, 0, data, 6, {4}, parent[1])[4]
    assert all(torch.equal(same.model[k], parent[4].model[k]) for k in same.model)
    assert not all(torch.equal(other.model[k], parent[4].model[k]) for k in other.model)
