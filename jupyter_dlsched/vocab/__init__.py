"""What a job is, in words every room shares: its spec, resources and where they fit, its
states and the ledger's schema, errors, units, times and the words people read.

Nothing here does I/O but ``private`` (the state folder's safety checks); every other
room may import this one, and this one imports no other room of the package.
"""
