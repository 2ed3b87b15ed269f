"""Starting runs: on this machine (``rft-run``) or on SLURM (``rft-launch``, ``rft-add-explorer``).

``cli`` (the entry points), ``preflight`` (login-node checks and the plan), ``local`` (processes
on this machine), ``slurm`` (sbatch rendering, submission), ``submit`` (submitit, waiting),
``worker`` (one process of a role under srun, torchrun or the local launcher).
"""
