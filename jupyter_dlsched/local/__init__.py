"""Jobs run on this machine: the chain of processes from a start request to the job's code.

Which code runs in which process, in the order a job meets them:

* ``launcher.py`` — in the process that decided (a kernel, the CLI or the
  server; the pool agent forks supervisors itself): ask this user's launcher
  to start the supervisor, else start it in a fresh interpreter;
* ``forkserver.py`` — the launcher (``python -m jupyter_dlsched.local.forkserver``):
  one preloaded process per user and state folder that forks supervisors and
  stagers in milliseconds;
* ``supervisor.py`` — the supervisor of one job, in its own session: claims
  the job, forks the job process(es), renews the lease, enforces limits,
  records how the job ended, and then has the pool decide again;
* ``containment.py`` — every process of a job, wherever it went: the
  supervisor is their subreaper, and in a shared pool each job has a cgroup;
  what the supervisor signals, kills and waits for;
* ``usage.py`` — what a run uses: CPU, RAM and GPU memory of all of its
  processes, now and over the run;
* ``jobproc.py`` — the job process(es), forked by the supervisor: environment,
  cores, ranks, the payload run and its result or error written; in a shared
  pool it first becomes the job's owner and executes
* ``jobrun.py`` — ``python -m jupyter_dlsched.local.jobrun``: the same job
  process as a fresh interpreter of its owner, with nothing of the service in it.

What the job's own code calls (``dls.progress``, ``dls.checkpoint_requested``,
``dls.data``) is ``jupyter_dlsched.inside.runtime``: it serves jobs of every backend
(Ray and SLURM job processes, inline cells), so it is not in this folder.
"""
