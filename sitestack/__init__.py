"""sitestack: provision PyTorch distributed-training stacks on HPC sites.

The library behind ``tasks.py``. Every change to a host is a :class:`~sitestack.core.step.Step`
run by :func:`~sitestack.core.step.converge` through a :class:`~sitestack.core.hostbase.Host`.
"""

__version__ = "0.1.0"
