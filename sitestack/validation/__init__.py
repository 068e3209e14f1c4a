"""The validation DDP job: rendering it from site facts, installing it, running it, reading its result.

- :mod:`.masks`: CPU masks per rank derived from ``gpu.cpu_bind``;
- :mod:`.jobs`: batch scripts (one per launcher), the check config and the README, from the facts;
- :mod:`.ddp_check` / :mod:`.ddp_report`: the check program and its report, installed on the site
  as plain scripts (they do not import sitestack); ddp_check also reads Slurm host lists
  (``nid[001-004,007],nid010``).

The ``install-validation-job`` action is :mod:`sitestack.actions.validation_job`; ``invoke validate``
(run the job, read the verdict) is :mod:`sitestack.engine.validate`.
"""
