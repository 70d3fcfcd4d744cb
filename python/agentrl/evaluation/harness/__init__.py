"""The trusted harness that judges a function task inside a box (see :mod:`.judge`)."""
