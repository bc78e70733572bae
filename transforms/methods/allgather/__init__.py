"""All-gather of sparse gradients' touched rows (method.py)."""
