"""Weight transports to Ray rollout workers: one file each, both ends in one class (``base.py``)."""
