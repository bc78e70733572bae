"""Cross-cutting graph features (base.py: the interface; registry.py: the
table of features, in the order they find and rewrite). A feature is one
GraphFeature subclass in its own module; this __init__ imports nothing."""
