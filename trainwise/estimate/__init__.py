"""Estimate: memory (and later time) of a traced step on a device."""
