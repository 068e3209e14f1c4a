"""Site facts for recipe unit tests, built inline (the site playbooks may change under us)."""

from __future__ import annotations

import copy
from typing import Any

from sitestack.core import schema
from sitestack.model.site import Facts

_BASE: dict[str, Any] = {
    "description": "test site",
    "marker": None,
    "prefix": "/opt/stack",
    "node": {"cores": 2},
    "gpu": {"vendor": "none"},
    "modules": {"system": "lmod", "init": "/usr/share/lmod/lmod/init/bash"},
    "mpi": {"flavour": "mpich", "cc": "mpicc", "cxx": "mpicxx", "launcher": "mpiexec", "library_match": "MPICH"},
    "network": {"fabric": "loopback"},
    "scheduler": {"kind": "none"},
    "python": {"source": "system", "version": "3.11", "executable": "python3"},
    "torch": {"version": "2.13.0", "variant": "cpu"},
    "collectives": "gloo",
}

FRONTIER: dict[str, Any] = {
    "description": "Frontier",
    "marker": "/lustre/orion",
    "prefix": "/lustre/orion/abc123/world-shared/sitestack",
    "node": {"cores": 64},
    "gpu": {"vendor": "amd", "model": "MI250X", "arch": "gfx90a", "unit": "gcd", "per_node": 8},
    "modules": {"system": "lmod", "init": "/opt/cray/pe/lmod/lmod/init/bash",
                "load": ["PrgEnv-gnu/8.5.0", "rocm/5.7.1", "craype-accel-amd-gfx90a", "miniforge3/23.11.0-0",
                         "gcc-native/12.3", "cray-mpich/8.1.28", "libtool"]},
    "mpi": {"flavour": "cray-mpich", "cc": "cc -shared", "cxx": "CC", "launcher": "srun",
            "library_match": "CRAY MPICH"},
    "network": {"fabric": "slingshot-11", "libfabric_provider": "cxi"},
    "scheduler": {"kind": "slurm", "partition": "batch"},
    "python": {"source": "conda", "version": "3.10", "module": "miniforge3/23.11.0-0", "executable": "python3"},
    "torch": {"version": "2.2.2", "variant": "rocm5.7"},
    "collectives": "rccl",
    "rocm": {"version": "5.7.1", "home": "/opt/rocm-5.7.1"},
    "build_jobs": 8,
}

LUMI: dict[str, Any] = {
    "description": "LUMI-G",
    "marker": "/appl/lumi",
    "prefix": "/project/project_465000000/sitestack",
    "node": {"cores": 64},
    "gpu": {"vendor": "amd", "model": "MI250X", "arch": "gfx90a", "unit": "gcd", "per_node": 8},
    "modules": {"system": "lmod", "init": "/opt/cray/pe/lmod/lmod/init/bash",
                "load": ["LUMI/24.03", "partition/G", "PrgEnv-gnu", "rocm/6.0.3", "craype-accel-amd-gfx90a"]},
    "mpi": {"flavour": "cray-mpich", "cc": "cc -shared", "cxx": "CC", "launcher": "srun",
            "library_match": "CRAY MPICH"},
    "network": {"fabric": "slingshot-11", "libfabric_provider": "cxi"},
    "scheduler": {"kind": "slurm", "partition": "standard-g"},
    "python": {"source": "container", "version": "3.12", "executable": "/opt/miniconda3/envs/pytorch/bin/python"},
    "torch": {"version": "2.7.1", "variant": "rocm6.2.4"},
    "collectives": "rccl",
    "rocm": {"version": "6.2.4", "home": "/opt/rocm-6.2.4"},
}


def facts(base: dict[str, Any] | None = None, **overrides: Any) -> Facts:
    """Facts from ``base`` (default: a plain local-like site) with top-level keys replaced;
    ``section__key=value`` replaces one key of a section (``mpi__cc="no-such-cc"``)."""
    data = copy.deepcopy(base or _BASE)
    for key, value in overrides.items():
        if "__" in key:
            section, sub = key.split("__", 1)
            data[section][sub] = value
        else:
            data[key] = value
    return schema.build(Facts, data, "<test facts>")
