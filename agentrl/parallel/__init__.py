"""Process groups and sharding: ranks (collectives with time limits), DDP/FSDP2/HSDP wrapping."""
