"""What one training sample is made of for the tasks beyond text, read from the model's
config: the image an image classifier sees, the audio a speech model hears, the image
tokens a vision-language model reads before its text.

`--seq-len` keeps one meaning per task, so that tokens/s and the estimate stay comparable
with the text tasks:

* image-cls: the image's patches, (height / patch_size) x (width / patch_size). The image
  size is the config's, so the sequence is fixed by the model (`fixed_seq_len`);
* speech-seq2seq (Whisper): the decoder's text tokens; the encoder always hears the
  config's full window (num_mel_bins x 2 max_source_positions log-mel frames);
* ctc (Wav2Vec2, HuBERT, WavLM...): raw audio samples (16,000 a second at 16 kHz); the
  transcript is a third of the frames the feature encoder makes of them;
* vision-lm (LLaVA): text tokens including the image's tokens, which come first.

A config whose inputs cannot be sized this way (no image_size or patch_size, a speech
model other than Whisper, a vision-language model other than LLaVA's layout) is refused
when the model is resolved, naming what is supported."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PretrainedConfig

from trainwise.common.errors import InputError

TEXT_TASKS = ("causal-lm", "seq-cls", "seq2seq", "masked-lm", "token-cls")
TRANSCRIPT_SHARE = 3  # a CTC transcript has one label per this many audio frames (at least one)
_SPEECH_SEQ2SEQ_FAMILIES = ("whisper",)
_VISION_LANGUAGE_FAMILIES = ("llava",)


@dataclass(frozen=True)
class ImageShape:
    """The pixel_values of one image: channels x height x width (pixels), and its patches."""

    channels: int
    height: int
    width: int
    patch: int

    @property
    def patches(self) -> int:
        return (self.height // self.patch) * (self.width // self.patch)


def image_shape(config: PretrainedConfig) -> ImageShape | None:
    """The image a vision config (or a model's vision_config) takes; None when the config
    does not say its image_size, patch_size and num_channels."""
    vision = getattr(config, "vision_config", None) or config
    size, patch = getattr(vision, "image_size", None), getattr(vision, "patch_size", None)
    channels = getattr(vision, "num_channels", 3)
    height, width = (size, size) if isinstance(size, int) else tuple(size or (None, None))[:2]
    patch = patch[0] if isinstance(patch, (list, tuple)) else patch
    if not all(isinstance(v, int) and v > 0 for v in (height, width, patch, channels)):
        return None
    return ImageShape(channels, height, width, patch)


def image_token_count(config: PretrainedConfig) -> int:
    """Image tokens a LLaVA-style model puts in the text for one image: the vision tower's
    patches, plus its class token when the "full" feature strategy keeps it."""
    shape = image_shape(config)
    keeps_class = getattr(config, "vision_feature_select_strategy", "default") == "full"
    return shape.patches + (1 if keeps_class else 0)


def audio_frames(config: PretrainedConfig, samples: int) -> int:
    """Frames a Wav2Vec2-style feature encoder makes of `samples` raw audio samples: each
    convolution (kernel k, stride s) maps L to (L - k) // s + 1; an adapter halves again."""
    length = samples
    for kernel, stride in zip(config.conv_kernel, config.conv_stride):
        length = (length - kernel) // stride + 1
    if getattr(config, "add_adapter", False):
        for _ in range(config.num_adapter_layers):
            length = (length + 2 - config.adapter_kernel_size) // config.adapter_stride + 1
    return length


def transcript_length(config: PretrainedConfig, samples: int) -> int:
    """Labels in one synthetic CTC transcript for `samples` audio samples."""
    return max(1, audio_frames(config, samples) // TRANSCRIPT_SHARE)


def mel_window(config: PretrainedConfig) -> tuple[int, int]:
    """(mel bins, frames) of the log-mel features Whisper's encoder takes: always its full
    window, 2 frames a position of max_source_positions."""
    return config.num_mel_bins, 2 * config.max_source_positions


def check_task_inputs(name: str, config: PretrainedConfig, task: str) -> None:
    """InputError naming MODEL when trainwise cannot size `task`'s inputs from `config`."""
    family = config.model_type
    if task == "image-cls" and image_shape(config) is None:
        raise InputError("MODEL", f"{name} ({family}) does not give image_size, patch_size and num_channels in its "
                                  "config, which size the synthetic images (ViT, DeiT, BEiT, Swin, ConvNeXt, DINOv2 "
                                  "and CLIP/SigLIP vision models do)")
    if task == "speech-seq2seq" and family not in _SPEECH_SEQ2SEQ_FAMILIES:
        raise InputError("MODEL", f"{name} is a {family} speech model; trainwise makes speech-seq2seq inputs for "
                                  f"{', '.join(_SPEECH_SEQ2SEQ_FAMILIES)} (log-mel features) only")
    if task == "ctc" and not (hasattr(config, "conv_kernel") and hasattr(config, "conv_stride")):
        raise InputError("MODEL", f"{name} ({family}) does not take raw audio through a convolutional feature "
                                  "encoder (conv_kernel, conv_stride); trainwise makes CTC inputs for Wav2Vec2, "
                                  "HuBERT, WavLM, SEW, UniSpeech and Data2Vec-Audio")
    if task == "vision-lm" and (family not in _VISION_LANGUAGE_FAMILIES or image_shape(config) is None):
        raise InputError("MODEL", f"{name} is a {family} vision-language model; trainwise makes image and text "
                                  f"inputs for {', '.join(_VISION_LANGUAGE_FAMILIES)} only (one image, its patches "
                                  "as image tokens)")


def fixed_seq_len(spec) -> tuple[int, str] | None:
    """(sequence length, why) when `spec`'s model fixes it (an image classifier: its
    image's patches), else None. `spec` is a ModelSpec."""
    if spec.task != "image-cls":
        return None
    shape = image_shape(spec.config)
    return shape.patches, (f"{shape.height}x{shape.width} px images in {shape.patch} px patches, from its config")


def check_task_seq_len(spec, seq_len: int) -> None:
    """InputError naming --seq-len when `seq_len` cannot make one sample of `spec`'s task."""
    fixed = fixed_seq_len(spec)
    if fixed is not None and seq_len != fixed[0]:
        raise InputError("--seq-len", f"{spec.name} sees {fixed[0]} patches per image ({fixed[1]}); --seq-len does "
                                      f"not resize images: drop it or pass {fixed[0]}")
    if spec.task == "ctc" and audio_frames(spec.config, seq_len) < 1:
        raise InputError("--seq-len", f"is raw audio samples for a CTC model; {seq_len} make no frame of "
                                      f"{spec.name}'s feature encoder: pass a few thousand (16,000 = 1 s at 16 kHz)")
    if spec.task == "vision-lm" and seq_len <= image_token_count(spec.config):
        raise InputError("--seq-len", f"must exceed the {image_token_count(spec.config)} image tokens {spec.name} "
                                      "puts before the text")


def fit_task_sequence(plan, spec) -> tuple:
    """(plan, notes): an image classifier's sequence is its image's patches, so the plan's
    default sequence length is set to them, with a note; any other length given is refused
    (--seq-len does not resize images). `plan` is a Plan, `spec` a ModelSpec or None."""
    fixed = fixed_seq_len(spec) if spec is not None and spec.config is not None else None
    if fixed is None or plan.seq_len == fixed[0]:
        return plan, []
    if plan.seq_len != type(plan)().seq_len:
        check_task_seq_len(spec, plan.seq_len)
    return plan.replace(seq_len=fixed[0]), [f"seq_len set to {fixed[0]} patches per image ({fixed[1]}): an image "
                                            "classifier's sequence is its image"]
