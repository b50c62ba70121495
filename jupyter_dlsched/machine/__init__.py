"""What this machine has: CPU cores, memory and GPUs (``inventory``, through the one NVML
gateway ``nvml``), their live use (``gpu_watch``, ``sampling``) and how the pool reads to
people and scrapers (``pool_view``, ``metrics``).
"""
