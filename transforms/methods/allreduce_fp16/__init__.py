"""Ring all-reduce with float16 compression (method.py)."""
