"""The bench: measuring techniques for real, next to their predictions (`trainwise bench`).

A ladder (`ladders.py`) is a list of plans, each a rung changing a few knobs from a base.
Each row runs in a fresh Python process (`runner.py`), so no row inherits another's
allocator state or compiled code; the same plan is also run through the Hugging Face
Trainer as the baseline (`hf_trainer_worker.py`, `baseline_ratio.py`). Rows are built from
a run's metrics summary (`rows.py`, `repeats.py`), written atomically after every row
(`results.py`, `markdown.py`) and drawn (`chart.py`); `capability.py` marks what this
installation cannot run before any process starts. Calibrating a device into a profile is
`trainwise/calibration/`."""
