"""Command line: thin parsing and rendering around `trainwise.api`."""
