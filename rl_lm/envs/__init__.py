"""Multi-turn environments with tools (rl_lm/envs/base.py is the interface)."""
