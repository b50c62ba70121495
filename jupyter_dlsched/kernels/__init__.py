"""GPU kernels: a notebook kernel whose GPUs are leased from the pool (``docs/kernels.md``).

``provisioner`` (the jupyter_client kernel provisioner), ``lease`` (the job process that
holds a kernel's grant), ``activity`` (the IPython extension inside the kernel),
``control`` (the files they share), ``spares`` and ``spare`` (the warm kernel kept ahead
per GPU kernelspec, and its side of the handover), ``kernelspecs`` (``dlsched kernels
install|list|remove``).
Nothing here is imported by ``import jupyter_dlsched``.
"""
