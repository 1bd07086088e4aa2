"""`--data DIR` for an image classifier: one subfolder per class, read through datasets'
imagefolder builder, resized and normalised to the model's config, checked before training."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from trainwise.api.training import train
from trainwise.cli.main import main
from trainwise.engine.data.build import build_data
from trainwise.engine.run_config import RunConfig
from trainwise.models import resolve_model
from trainwise.plan.plan import Plan

COLOURS = {"red": (230, 20, 20), "green": (20, 230, 20), "blue": (20, 20, 230)}


def _folder(root, per_class: int = 10, classes=COLOURS):
    """Images of one noisy colour per class (so a classifier can learn them), odd sizes."""
    rng = np.random.default_rng(0)
    for name, colour in classes.items():
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            noise = rng.integers(0, 60, (30 + i, 41, 3))
            pixels = (np.array(colour)[None, None, :] * 0.75 + noise).clip(0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


def test_batches_are_the_models_image_size_normalised_with_labels_from_subfolders(tmp_path):
    spec = resolve_model("tiny-vit")
    data = build_data(RunConfig(data=str(_folder(tmp_path / "images"))), spec, Plan(batch_size=4, seq_len=64))
    batch = next(data.micro_batches())
    assert batch["pixel_values"].shape == (4, 3, 64, 64) and batch["pixel_values"].dtype == torch.float32
    assert -1.0 <= float(batch["pixel_values"].min()) and float(batch["pixel_values"].max()) <= 1.0  # mean 0.5, std 0.5
    assert set(batch["labels"].tolist()) <= {0, 1, 2}  # blue, green, red in sorted order
    assert "30 images in 3 classes (blue, green, red)" in data.description
    again = build_data(RunConfig(data=str(tmp_path / "images")), spec, Plan(batch_size=4, seq_len=64))
    resumed = next(again.micro_batches(start=3))
    third = list(zip(range(4), data.micro_batches()))[3][1]
    assert torch.equal(resumed["pixel_values"], third["pixel_values"])  # micro-batch k depends only on (seed, k)


def test_a_classifier_learns_the_colours_in_twenty_steps(tmp_path):
    metrics = tmp_path / "m.jsonl"
    train("tiny-vit", plan=Plan(device="cpu", batch_size=4, lr=1e-3, warmup_steps=0),
          run=RunConfig(data=str(_folder(tmp_path / "images")), steps=20, metrics=str(metrics), no_chart=True))
    losses = [json.loads(line)["loss"] for line in metrics.read_text().splitlines() if '"step"' in line]
    assert sum(losses[-4:]) / 4 < 0.7 * sum(losses[:2]) / 2, losses


@pytest.mark.fault
def test_an_unreadable_image_stops_the_run_naming_its_path(tmp_path, capsys, fault_log):
    root = _folder(tmp_path / "images", per_class=3)
    (root / "red" / "broken.png").write_bytes(b"not an image")
    code = main(["train", "tiny-vit", "--data", str(root), "--steps", "1"])
    err = capsys.readouterr().err
    fault_log(kind="bad input", case="train an image classifier on a folder with a file that is not an image",
              exit_code=code, message=err.strip().replace(str(tmp_path), "TMP"))
    assert code == 2 and "error: --data: " in err and "broken.png" in err and "Traceback" not in err


@pytest.mark.fault
@pytest.mark.parametrize("layout, words", [
    ("one-class", "at least 2"),
    ("many-classes", "has 12 classes, tiny-vit predicts 10"),
    ("a-file", "is not a folder"),
])
def test_a_folder_that_is_not_a_class_layout_is_refused(layout, words, tmp_path, capsys, fault_log):
    if layout == "one-class":
        data = _folder(tmp_path / "images", per_class=2, classes={"red": COLOURS["red"]})
    elif layout == "many-classes":
        data = _folder(tmp_path / "images", per_class=1, classes={f"c{i:02d}": (i * 20, 0, 0) for i in range(12)})
    else:
        data = tmp_path / "image.png"
        Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(data)
    code = main(["train", "tiny-vit", "--data", str(data), "--steps", "1"])
    err = capsys.readouterr().err
    fault_log(kind="bad input", case=f"train an image classifier on {layout.replace('-', ' ')} as --data",
              exit_code=code, message=err.strip().replace(str(tmp_path), "TMP"))
    assert code == 2 and "error: --data: " in err and words in err
