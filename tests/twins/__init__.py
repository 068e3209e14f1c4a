"""Twins: trees made in tests that stand in for what a site has and this machine lacks."""
