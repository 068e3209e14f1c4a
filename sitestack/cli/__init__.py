"""The command line: Invoke tasks, grouped by what they act on. ``tasks.py`` gathers them into
the root namespace. The top layer: it may import every other layer, and nothing imports it."""
