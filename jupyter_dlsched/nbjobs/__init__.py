"""Notebooks as jobs: a whole notebook run on the pool's GPUs with parameters.

``params.py`` turns ``-p NAME=VALUE`` and ``parameters={...}`` into the cell that is
injected after the cell tagged ``parameters`` (as papermill does); ``submit.py`` queues
the job (``dls.submit_notebook``, ``dlsched submit --notebook``); ``execute.py`` is what
runs in the job process: nbclient with a kernel of the notebook's kernelspec, the
executed copy written as each cell finishes, ``cell 12/40`` as the job's progress.
"""
