"""The notebook's side: ``%%schedule`` and ``%dlsched`` (``magics``), a cell run as a job
(``cells``, ``cell_names``, ``cell_jobs``) and errors shown the IPython way
(``ipython_errors``). Imported only when IPython loads the extension.
"""
