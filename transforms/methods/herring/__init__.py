"""Herring: balanced fusion buffers (bfb.py) summed on sharded summation
servers (method.py: planning, cost model, rewrite)."""
