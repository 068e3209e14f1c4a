"""The validation DDP job: rendering it from site facts, installing it, running it, reading its result.

- :mod:`.masks`: CPU masks per rank derived from ``gpu.cpu_bind``;
- :mod:`.jobs`: batch scripts (one per launcher), the check config and the README, from the facts;
  :mod:`.results_dir`: the check of a results directory the batch scripts run before anything else;
- the programs the job directory holds (``jobs.PROGRAMS``: the check program, its report, the NCCL
  log reader, the history, the start-up probe, the host-list parser) are :mod:`sitestack.onsite`,
  shipped by :mod:`sitestack.core.shipped`;
- :mod:`.launch_helpers`: the users' launch helpers (``sitestack-launch-env``) and job template.

The ``install-validation-job`` action is :mod:`sitestack.actions.validation_job`; ``invoke validate``
(run the job, read the verdict) is :mod:`sitestack.engine.validate`.
"""
