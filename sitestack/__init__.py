"""sitestack: provision PyTorch distributed-training stacks on HPC sites.

The library behind ``tasks.py``. Every change to a host is a :class:`~sitestack.step.Step`
run by :func:`~sitestack.step.converge` through a :class:`~sitestack.host.Host`.
"""

__version__ = "0.1.0"
