"""The bottom layer, which every other imports and which imports nothing of trainwise:
the errors that map to exit codes (errors.py), human units (units.py) and atomic file and
directory writes (atomic.py)."""
