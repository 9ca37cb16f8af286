"""onmt_lite: a small OpenNMT-style beam-search translator."""
