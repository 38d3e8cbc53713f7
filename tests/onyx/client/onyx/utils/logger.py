"""brig's stand-in for onyx's logger module: the vendored client only logs."""

import logging


def setup_logger(name: str = "onyx") -> logging.Logger:
    return logging.getLogger(name)
