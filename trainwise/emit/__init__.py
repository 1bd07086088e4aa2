"""Launch files for others: a chosen plan written for another launcher or a cluster
(`plan --emit`: TrainingArguments, accelerate, DeepSpeed, torchrun, Slurm, torchtitan), and
the `trainwise train` line that runs it (`train_line.py`). Reads a Plan and what the user gave
`plan` for the run; searches nothing, so `search/` and `api/` hand it the plan."""
