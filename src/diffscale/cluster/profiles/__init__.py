"""Cluster profiles: the types, the bundled YAML files beside this module, reading and writing them,
and ``cluster discover``."""
