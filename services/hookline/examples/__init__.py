"""Example providers and handlers used by ``hookline dev``."""
