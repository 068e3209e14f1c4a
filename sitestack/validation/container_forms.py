"""A batch script's container lines, rendered from the runtime's table row
(:data:`sitestack.model.container_runtimes.RUNTIME_TABLE`): the validation job, the tuning sweep and
the job template (``invoke job-template``) all take their container context from :func:`script_container`,
so their templates print the row's forms and never test a runtime's name.

What a script gets, for a runtime whose row says so:

- ``sbatch``: the option that names the job's image (Shifter's ``--image=docker:IMG``);
- ``bind_var`` and ``binds``: the variable the runtime reads binds from, and its value;
- ``pass_in``: ``<P>ENV_NAME="${NAME}"`` exports that pass the submission's choices in;
- ``options``: the words of the ``CONTAINER_OPTIONS`` array, for a runtime that takes binds,
  environment and its modules (GPUs, the site's network plugin, MPI) as options;
- ``exec_prefix``: what runs a command in the image, e.g. ``singularity exec "$SIF" ``,
  ``shifter --image="$SIF" "${CONTAINER_OPTIONS[@]}" ``,
  ``podman-hpc run --rm --env-host "${CONTAINER_OPTIONS[@]}" "$SIF" ``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sitestack.core.quoting import sh, sh_expanding
from sitestack.model.container_facts import Container, container_features, runtime_of

#: The bash array a script keeps the runtime's options in.
OPTIONS_ARRAY = "CONTAINER_OPTIONS"


def script_container(container: Container, *, gpus: bool, binds: Sequence[str], pass_names: Sequence[str],
                     append_binds: bool = False) -> dict[str, Any]:
    """The template context of ``container`` in a batch script. ``binds``: host paths (``$NAME``
    references expand when the script runs); ``pass_names``: variables whose value the script passes
    into the image; ``gpus``: the site's nodes have GPUs; ``append_binds``: the script adds its binds
    to what the user's environment already binds (the job template) instead of setting them."""
    runtime = runtime_of(container)
    features = container_features(container, gpus)
    binds = list(dict.fromkeys(b for b in binds if b))
    options: list[str] = []
    bind_value = ""
    if runtime.bind_var:
        joined = sh_expanding(",".join(binds))
        bind_value = (f'"${{{runtime.bind_var}:+${runtime.bind_var},}}"{joined}' if append_binds else joined)
    else:
        options += [sh_expanding(word) for word in runtime.bind_words(binds)]
    # the option's form is shell text that expands NAME when the script runs (--env=NAME="${NAME}")
    passed = runtime.env_words(pass_names)
    options += passed
    modules = runtime.module_words(features)
    options += [sh(word) for word in modules]
    pass_in = [(runtime.env_var(name), name) for name in pass_names] if runtime.env_prefix else []
    words = runtime.exec_argv('"$SIF"', [], options=[f'"${{{OPTIONS_ARRAY}[@]}}"'] if options else [])
    return {
        "runtime": runtime.name,
        "image": container.image or "",
        "sbatch": [runtime.sbatch_image.format(image=container.image)] if runtime.sbatch_image and container.image
        else [],
        "bind_var": runtime.bind_var or "",
        "binds": bind_value,
        "pass_in": pass_in,
        "options": " ".join(options),
        "options_array": OPTIONS_ARRAY,
        "modules": " ".join(modules),
        "passes_env": bool(passed),   # the submission's choices go in as options
        "exec_prefix": " ".join(words) + " ",
    }


__all__ = ["OPTIONS_ARRAY", "script_container"]
