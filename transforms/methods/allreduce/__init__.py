"""Ring all-reduce of dense gradients in fused buckets, flat or by 2-D
summation (method.py)."""
