"""What every layer shares (installed as ``autopar.common``): the errors a user
can cause. A leaf: it imports nothing from autopar, transforms or runtime."""
