"""The planner: search every plan for a model and a machine, rank them by predicted speed,
verify the best few on the device, and hand the winner to `train` or another launcher."""
