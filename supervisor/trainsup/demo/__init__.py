"""A tiny kohya-compatible trainer (real torch on CPU) used by `trainsup demo` and the tests."""
