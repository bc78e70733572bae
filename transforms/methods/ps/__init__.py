"""Parameter servers: planning and cost (method.py), the graph protocol
(rewrite.py)."""
