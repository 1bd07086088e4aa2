"""The catalog's tiny model for each task beyond text and the --seq-len it is measured at,
shared by tests/test_tasks_beyond_text.py and benchmarks/tasks_cpu.py (the same rows)."""

# model -> (task, --seq-len: patches, decoder tokens, audio samples or text + image tokens)
MODELS = {
    "tiny-vit": ("image-cls", 64),
    "tiny-swin": ("image-cls", 256),
    "tiny-convnext": ("image-cls", 256),
    "tiny-whisper": ("speech-seq2seq", 32),
    "tiny-wav2vec2": ("ctc", 4000),
    "tiny-llava": ("vision-lm", 96),
    "tiny-bert": ("token-cls", 64),
}
