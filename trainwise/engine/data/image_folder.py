"""Image classification data from a folder: one subfolder per class, images inside
(`--data DIR` for an image-cls model). Read with `datasets`' imagefolder builder (offline;
labels are the subfolder names in sorted order), decoded with Pillow, resized to the
model's image_size and normalised with the mean and standard deviation of the model
directory's preprocessor_config.json when it has one, else 0.5 and 0.5 (ViT's).

Every image is opened once before training, so a file Pillow cannot read stops the run
with its path (exit 2) instead of killing a worker mid-run. The held-out share for
`--eval-every` is drawn once from the seed, like the text data's; micro-batch g is a pure
function of (seed, g) through MicroBatchOrder, so resuming needs no replay."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from trainwise.common.errors import InputError
from trainwise.engine.data.order import MicroBatchOrder, mixed_seed
from trainwise.engine.data.train_data import TrainData
from trainwise.models.task_inputs import ImageShape, image_shape

HELD_OUT_SHARE = 0.02  # of the images, at least --eval-batches worth, at most 10 %
HELD_OUT_STREAM = 4  # the seed stream that picks the held-out images
DEFAULT_MEAN_STD = (0.5, 0.5)


class ImageMicroBatches(Dataset):
    """Micro-batch number -> pixel_values (batch x channels x height x width) and labels."""

    def __init__(self, images, indices: list[int], order: MicroBatchOrder, preprocess):
        self.images, self.indices, self.order, self.preprocess = images, indices, order, preprocess

    def __getitem__(self, number: int) -> dict[str, torch.Tensor]:
        return self.preprocess(self.images, [self.indices[i] for i in self.order.rows(number).tolist()])


class Preprocess:
    """Decode, resize and normalise rows of the image dataset into one batch."""

    def __init__(self, shape: ImageShape, mean, std):
        self.shape = shape
        self.mean = torch.tensor(mean, dtype=torch.float32).reshape(-1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).reshape(-1, 1, 1)

    def __call__(self, images, rows: list[int]) -> dict[str, torch.Tensor]:
        picked = images.select(rows)
        pixels = torch.stack([self._pixels(image) for image in picked["image"]])
        return {"pixel_values": pixels, "labels": torch.tensor(picked["label"], dtype=torch.long)}

    def _pixels(self, image) -> torch.Tensor:
        image = image.convert("L" if self.shape.channels == 1 else "RGB")
        image = image.resize((self.shape.width, self.shape.height), resample=2)  # bilinear
        array = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0)
        array = array.unsqueeze(0) if array.dim() == 2 else array.permute(2, 0, 1)
        return (array - self.mean) / self.std


def image_folder_data(run, spec, plan, rank: int, world_size: int) -> TrainData:
    """TrainData from the class subfolders of `run.data` for an image classifier `spec`."""
    root = Path(run.data).expanduser()
    classes = _classes(root, spec)
    images = _load(root)
    _check_readable(images, root)
    shape = image_shape(spec.config)
    mean, std = _normalisation(spec, shape.channels)
    held_out, train = _split(len(images), run.eval_batches * plan.batch_size, run.seed)
    if len(train) < plan.batch_size * world_size:
        raise InputError("--data", f"{root} has {len(train)} training image(s): too few for {world_size} "
                                   f"micro-batch(es) of {plan.batch_size}; lower --batch-size or add images")
    order = MicroBatchOrder(len(train), plan.batch_size, run.seed, rank, world_size)
    preprocess = Preprocess(shape, mean, std)

    def evaluation(n: int) -> list:
        starts = range(0, len(held_out), plan.batch_size)[:n]
        return [preprocess(images, held_out[s:s + plan.batch_size]) for s in starts]

    description = (f"{root}: {len(images):,} images in {len(classes)} classes ({', '.join(classes[:5])}"
                   f"{', ...' if len(classes) > 5 else ''}); {len(train):,} training and {len(held_out):,} held-out, "
                   f"resized to {shape.height}x{shape.width} px, normalised with mean {mean[0]:g} and std {std[0]:g}"
                   f"{' (the model folder' + chr(39) + 's preprocessor_config.json)' if _processor_file(spec) else ''}")
    return TrainData(ImageMicroBatches(images, train, order, preprocess), evaluation, description=description,
                     tokens_per_micro_batch=plan.batch_size * plan.seq_len, micro_batches_per_epoch=order.per_epoch,
                     workers=plan.workers, pin_memory=plan.pin_memory, seed=run.seed)


def _classes(root: Path, spec) -> list[str]:
    if not root.is_dir():
        raise InputError("--data", f"an image classifier trains on a folder of class subfolders of images (or "
                                   f"--data synthetic); {root} is not a folder")
    classes = sorted(entry.name for entry in root.iterdir() if entry.is_dir() and not entry.name.startswith("."))
    if len(classes) < 2:
        raise InputError("--data", f"{root} needs one subfolder per class (at least 2), with the images inside")
    if len(classes) > spec.config.num_labels:
        raise InputError("--data", f"{root} has {len(classes)} classes, {spec.name} predicts "
                                   f"{spec.config.num_labels} (num_labels in its config)")
    return classes


def _load(root: Path):
    import datasets

    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # its "downloading" bars are local reads; the data line says what was read
    try:
        return datasets.load_dataset("imagefolder", data_dir=str(root), split="train")
    except (ValueError, FileNotFoundError) as error:
        raise InputError("--data", f"{root}: {str(error).splitlines()[0]}") from None
    finally:
        if shown:
            datasets.enable_progress_bars()


def _check_readable(images, root: Path) -> None:
    """Open every image once (without decoding the dataset column: paths only)."""
    from datasets import Image as ImageFeature
    from PIL import Image, UnidentifiedImageError

    for row, item in enumerate(images.cast_column("image", ImageFeature(decode=False))):
        path = item["image"]["path"]
        try:
            with Image.open(path) as image:
                image.verify()
        except (UnidentifiedImageError, OSError) as error:
            raise InputError("--data", f"{path} (image {row}): Pillow cannot read it ({error})") from None


def _normalisation(spec, channels: int) -> tuple[list[float], list[float]]:
    """(mean, std) per channel: the model folder's preprocessor_config.json, else 0.5, 0.5."""
    path = _processor_file(spec)
    mean, std = DEFAULT_MEAN_STD
    if path is not None:
        settings = json.loads(path.read_text(encoding="utf-8"))
        mean, std = settings.get("image_mean", mean), settings.get("image_std", std)
    as_list = lambda value: [float(v) for v in value] if isinstance(value, (list, tuple)) else [float(value)] * channels  # noqa: E731
    return as_list(mean), as_list(std)


def _processor_file(spec) -> Path | None:
    if spec.source != "directory":
        return None
    path = Path(spec.name).expanduser() / "preprocessor_config.json"
    return path if path.is_file() else None


def _split(count: int, wanted: int, seed: int) -> tuple[list[int], list[int]]:
    """(held-out, training) image indices: a seeded draw of the held-out share."""
    held = min(max(wanted, int(count * HELD_OUT_SHARE)), int(count * 0.1))
    generator = torch.Generator().manual_seed(mixed_seed(seed, HELD_OUT_STREAM))
    permutation = torch.randperm(count, generator=generator).tolist()
    return sorted(permutation[:held]), sorted(permutation[held:])
