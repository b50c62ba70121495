"""What a running job imports: its context and progress (``runtime``), its devices and
rank (``job_device``) and checkpoints (``checkpoint``); ``jupyter_dlsched.torch`` is their
public face. Loaded in every job process, so it imports little and no front end.
"""
