"""Images are read the way the model reads them: through its folder's image
processor when it has one (resize, crop, normalise; mixed sizes are fine), as they are when
it has none. rotviz's loss must equal a reference loop that uses `AutoImageProcessor`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rotviz.cli import main
from rotviz.data.reading import split_for
from rotviz.data.split import load_split
from rotviz.data.splits import tenth_split
from rotviz.errors import RotvizError
from rotviz.evaluation import evaluate
from rotviz.sources.loading import load_model

SIZES = ((40, 30), (32, 32), (50, 64), (24, 36))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import transformers as T
    from PIL import Image

    root = tmp_path_factory.mktemp("img")
    rng = np.random.default_rng(0)
    for c in range(3):
        (root / "imgs" / f"class{c}").mkdir(parents=True)
        for i in range(12):
            w, h = SIZES[(c + i) % len(SIZES)]
            a = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
            a[..., c] = 200  # a class signal in one colour
            Image.fromarray(a).save(root / "imgs" / f"class{c}" / f"{i:02d}.png")
    proc = T.ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.4, 0.5, 0.6],
                               image_std=[0.2, 0.25, 0.3])
    folders = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        cfg = T.ViTConfig(image_size=32, patch_size=8, num_channels=3, num_labels=3,
                          hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0)
        d = root / f"vit{seed}"
        T.ViTForImageClassification(cfg).eval().save_pretrained(d)
        proc.save_pretrained(d)
        folders.append(d)
    return root, folders


def test_loss_equals_a_reference_loop_with_the_models_processor(setup):
    import transformers as T
    from PIL import Image

    root, (a, _) = setup
    loaded = load_model(str(a))
    split = split_for(loaded, f"imagefolder:{root / 'imgs'}", "test")
    got = evaluate(loaded, split)

    files = sorted((p, c) for c in range(3) for p in (root / "imgs" / f"class{c}").iterdir())
    files = sorted(files, key=lambda fc: (fc[1], fc[0].name))
    idx = tenth_split(len(files), 0)["test"]
    proc = T.AutoImageProcessor.from_pretrained(str(a), local_files_only=True)
    images = [Image.open(files[i][0]).convert("RGB") for i in idx]
    pixels = proc(images=images, return_tensors="pt")["pixel_values"]
    labels = torch.tensor([files[i][1] for i in idx])
    model = T.ViTForImageClassification.from_pretrained(str(a)).eval()
    with torch.no_grad():
        want = model(pixel_values=pixels, labels=labels).loss.item()
    assert split.n == len(idx) and split.inputs.shape[1:] == (3, 32, 32)
    assert got["loss"] == pytest.approx(want, abs=1e-5)
    assert 0 <= got["macro_f1"] <= 1


def test_commands_run_and_outputs_carry_the_processor(setup, tmp_path):
    import transformers as T

    root, (a, b) = setup
    data = f"imagefolder:{root / 'imgs'}"
    assert main(["barrier", str(a), str(b), "--data", data, "--points", "3"]) == 0
    assert main(["match", str(a), str(b), "--out", str(tmp_path / "m")]) == 0
    T.AutoImageProcessor.from_pretrained(str(tmp_path / "m"), local_files_only=True)
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        ref = T.ViTForImageClassification.from_pretrained(str(b)).eval()(pixel_values=x).logits
        out = T.ViTForImageClassification.from_pretrained(str(tmp_path / "m")).eval()(
            pixel_values=x).logits
    assert torch.allclose(ref, out, atol=1e-4)


def test_without_a_processor_mixed_sizes_and_parent_folders_are_one_line(setup, capsys):
    root, _ = setup
    with pytest.raises(RotvizError, match="differ in size.*image processor"):
        load_split(f"imagefolder:{root / 'imgs'}")
    with pytest.raises(RotvizError, match="holds folders .* point imagefolder: at"):
        load_split(f"imagefolder:{root}")
    # images read as they are do not fit a model that reads through a processor
    loaded = load_model(str(setup[1][0]))
    from rotviz.data.reading import check_fits

    with pytest.raises(RotvizError, match="read as they are .* its own image processor"):
        check_fits(loaded, load_split("digits"))


def test_a_pair_whose_processors_differ_is_refused(setup, tmp_path, capsys):
    import shutil

    import transformers as T

    _, (a, b) = setup
    other = tmp_path / "other"
    shutil.copytree(b, other)
    T.ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.5] * 3,
                        image_std=[0.5] * 3).save_pretrained(other)
    assert main(["match", str(a), str(other), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert "read images differently" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "m").exists()
