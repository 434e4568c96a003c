"""Experiment configs: each `<x>.py` has `get_config(arg)` and its run command in the docstring."""
