"""The plan search: search every plan for a model and a machine, rank them by predicted
speed, verify the best few on the device, and hand the winner to `train` (`trainwise/emit/`
writes it for other launchers)."""
