"""Synchronisation methods, one package each (base.py: the interface;
registry.py: the table of methods; policy.py: which methods each run option
lets a variable use). A package's __init__ imports nothing, so importing one
of its modules never imports every method."""
