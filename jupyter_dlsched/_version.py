"""The release of this package (``jupyter_dlsched.__version__``), in a module that imports
nothing, so the agent and the scheduler can report it without importing the package's
``__init__`` (which imports them)."""

__version__ = "0.1.0"
