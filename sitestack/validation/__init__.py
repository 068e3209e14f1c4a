"""The validation DDP job: rendering it from site facts, installing it, running it, reading its result.

- :mod:`.masks`: CPU masks per rank derived from ``gpu.cpu_bind``;
- :mod:`.jobs`: batch scripts (one per launcher), the check config and the README, from the facts;
  :mod:`.results_dir`: the check of a results directory the batch scripts run before anything else;
- :mod:`.ddp_check` (entry point) with its package :mod:`.ddpcheck`, :mod:`.ddp_report`
  with :mod:`.report_plot`, :mod:`.nccl_log` with :mod:`.nccl_lines`, :mod:`.nccl_parse` and :mod:`.nccl_nodes`: the check
  program, its report and the NCCL log reader,
  installed on the site as plain files (``jobs.PROGRAM_FILES``, with ``programs/hostlist.py`` and ``programs/visible.py``;
  they do not import sitestack);
- :mod:`.launch_helpers`: the users' launch helpers (``sitestack-launch-env``) and job template.

The ``install-validation-job`` action is :mod:`sitestack.actions.validation_job`; ``invoke validate``
(run the job, read the verdict) is :mod:`sitestack.engine.validate`.
"""
