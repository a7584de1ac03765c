"""trainsup: a supervisor for kohya-style training runs."""

__version__ = "0.1.0"
